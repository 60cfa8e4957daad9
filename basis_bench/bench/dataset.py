"""The benchmark's data: a rollouts directory with its reference resolved, split per
checkpoint into the held-out oracle, the pool the estimators draw from, and the cache.

* oracle: the mean of the checkpoint's first ``oracle_n`` samples of each prompt (by
  sample_idx); the estimators never see them;
* pool: the checkpoint's remaining samples;
* cache: the reference policy's first ``ref_n`` samples.

Prompts without any reference sample cannot use the cache: they are dropped and counted.
The oracle is itself noisy: Var(oracle_i) = sigma_i^2 / oracle_n, estimated without bias
by the oracle samples' variance (ddof = 1) over oracle_n.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from basis_bench.errors import InputError
from basis_bench.rollouts.store import (
    dataset_metadata,
    default_dataset,
    file_policies,
    load_rollouts,
    reward_matrix,
    rollout_files,
)
from basis_bench.settings import check_scalar

DEFAULT_DATASET = default_dataset()
REFERENCE_NAME = "reference"


@dataclass(frozen=True)
class Dataset:
    """The rewards of a rollouts directory, with its reference policy resolved."""

    root: Path
    rollouts: pl.DataFrame  # prompt_id, policy, sample_idx, reward; sorted
    reference: str
    policies: list[str]  # the reference, then the checkpoints to evaluate (metadata order)
    metadata: list[dict[str, Any]]

    @property
    def checkpoints(self) -> list[str]:
        """Every non-reference policy: the default set of checkpoints to evaluate."""
        return [p for p in self.policies if p != self.reference]

    @property
    def simulated(self) -> bool:
        return any(m.get("simulated") for m in self.metadata)

    @property
    def synthetic_order(self) -> list[str]:
        """Policies whose rewards were expanded from counts (``order: synthetic``): exchangeable
        given the prompt, so replay is faithful, but sample_idx is not a generation order."""
        return sorted({str(m["policy"]) for m in self.metadata if m.get("order") == "synthetic"})

    @property
    def label(self) -> str:
        labels = sorted({str(m["label"]) for m in self.metadata if "label" in m})
        return "; ".join(labels) if labels else str(self.root)


def resolve_reference(
    policies: Sequence[str], metadata: Sequence[dict[str, Any]], reference: str | None
) -> str:
    """``reference`` if given, else the metadata's ``reference_policy``, else ``reference``."""
    if reference is not None:
        if reference not in policies:
            raise InputError(
                f"reference policy {reference!r} not in the dataset; policies: {', '.join(policies)}"
            )
        return reference
    named = {str(m["reference_policy"]) for m in metadata if "reference_policy" in m}
    if len(named) > 1:
        raise InputError(
            f"files disagree on the reference policy ({', '.join(sorted(named))}); pass --reference"
        )
    if named:
        (name,) = named
        if name not in policies:
            raise InputError(
                f"metadata names reference policy {name!r}, which has no rows; pass --reference"
            )
        return name
    if REFERENCE_NAME in policies:
        return REFERENCE_NAME
    raise InputError(
        f"cannot tell which policy is the reference (no 'reference_policy' in the metadata and none "
        f"called {REFERENCE_NAME!r}); pass --reference, one of: {', '.join(policies)}"
    )


def _check_parquet(files: Sequence[Path]) -> None:
    """Every ``*.parquet`` path of a dataset is a readable Parquet file, else an InputError
    that names it (a folder named x.parquet, a file cut short, garbage)."""
    import pyarrow.parquet as pq

    for f in files:
        if f.is_dir():
            raise InputError(f"{f} is a folder, not a Parquet file; move it out of the dataset")
        if not f.exists():
            continue
        try:
            pq.read_schema(f)
        except Exception as err:  # ArrowInvalid, OSError: garbage, truncated, unreadable
            raise InputError(
                f"{f} is not a readable Parquet file ({str(err).splitlines()[0]}); "
                "restore or remove it"
            ) from err


def open_dataset(
    root: str | os.PathLike[str] | None = None,
    reference: str | None = None,
    checkpoints: Sequence[str] | None = None,
) -> Dataset:
    """Load a rollouts directory (default: the dataset shipped in basis_bench/data/default).

    Only the reference and the requested checkpoints are read; an unknown checkpoint is an
    InputError that lists the known ones.
    """
    if root is None and not DEFAULT_DATASET.is_dir():
        raise InputError(
            f"the default dataset lives in the repository ({DEFAULT_DATASET} is missing): "
            "install from a clone with `pip install -e .`, or pass --rollouts DIR"
        )
    root = Path(root) if root is not None else DEFAULT_DATASET
    files = rollout_files(root)
    if not files:
        raise InputError(f"no rollouts Parquet files under {str(root)!r}")
    _check_parquet([*files, root / "prompts.parquet"])
    present = sorted({p for f in files for p in file_policies(f)})
    metadata = dataset_metadata(root)
    ordered: list[str] = []
    for m in metadata:
        ordered += [p for p in m.get("policies", []) if p in present and p not in ordered]
    policies = ordered + [p for p in present if p not in ordered]
    ref = resolve_reference(policies, metadata, reference)
    known = [p for p in policies if p != ref]
    wanted = known if not checkpoints else list(dict.fromkeys(checkpoints))
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise InputError(
            f"unknown checkpoint(s) {', '.join(map(repr, unknown))}; known: {', '.join(known) or '(none)'}"
        )
    if not wanted:
        raise InputError(f"{root}: no checkpoint policies besides the reference {ref!r}")
    df = load_rollouts(root, [ref, *wanted], optional=())  # rewards only, never the texts
    return Dataset(root, df, ref, [ref, *wanted], metadata)


@dataclass(frozen=True)
class CheckpointData:
    """One checkpoint's arrays over its P prompts (sorted by prompt_id)."""

    name: str
    prompt_ids: np.ndarray  # (P,) str
    oracle: np.ndarray  # (P,) mean of the first oracle_n samples
    oracle_noise: np.ndarray  # (P,) unbiased estimate of Var(oracle) = sigma^2 / oracle_n
    pool: np.ndarray  # (P, W) the other samples, NaN-padded on the right
    pool_count: np.ndarray  # (P,) valid samples in each pool row
    cache: np.ndarray  # (P, ref_n) reference rewards, NaN for a missing sample
    dropped_no_reference: int  # prompts dropped because the reference has no sample of them

    @property
    def n_prompts(self) -> int:
        return len(self.prompt_ids)

    @property
    def reward_range(self) -> tuple[float, float] | None:
        """(0, 1) when every reward lies in it (the estimators' default check), else None."""
        vals = np.concatenate(
            [self.pool[np.isfinite(self.pool)], self.cache[np.isfinite(self.cache)]]
        )
        return (0.0, 1.0) if vals.size == 0 or (vals.min() >= 0 and vals.max() <= 1) else None


def checkpoint_data(
    ds: Dataset, checkpoint: str, oracle_n: int, ref_n: int | None, min_pool: int
) -> CheckpointData:
    """Split a checkpoint's samples into oracle and pool, and attach the reference cache.

    Every kept prompt must have at least ``oracle_n + min_pool`` samples; otherwise the
    pool is too small and an InputError says by how much. ``ref_n=None`` keeps every
    reference sample.
    """
    check_scalar(oracle_n, "--oracle-n", int, min_val=2)  # its noise estimate needs a variance
    if ref_n is not None:
        check_scalar(ref_n, "--ref-n", int, min_val=1)
    df = ds.rollouts
    ids = df.filter(pl.col("policy") == checkpoint)["prompt_id"].unique().sort().to_numpy()
    ref_ids = df.filter(pl.col("policy") == ds.reference)["prompt_id"].unique().to_numpy()
    has_ref = np.isin(ids, ref_ids)
    dropped = int((~has_ref).sum())
    ids = ids[has_ref]
    if ids.size == 0:
        raise InputError(
            f"checkpoint {checkpoint!r}: none of its prompts is in the reference cache ({ds.reference!r})"
        )
    rewards = reward_matrix(df, checkpoint, ids)
    counts = np.isfinite(rewards).sum(axis=1)
    short = counts < oracle_n + min_pool
    if short.any():
        worst = int(counts.min())
        raise InputError(
            f"checkpoint {checkpoint!r}: the pool is smaller than the group size for {int(short.sum())} "
            f"prompt(s): {worst} samples - oracle-n {oracle_n} = {worst - oracle_n} left, {min_pool} needed; "
            "lower --oracle-n or --group-size"
        )
    oracle_samples = rewards[:, :oracle_n]
    pool = rewards[:, oracle_n:]
    pool = pool[:, : int(np.isfinite(pool).sum(axis=1).max())]
    ref = reward_matrix(df, ds.reference, ids)
    if ref_n is not None and ref.shape[1] < ref_n:
        raise InputError(
            f"--ref-n {ref_n} asks for more reference samples than the dataset has (at most {ref.shape[1]} per prompt)"
        )
    return CheckpointData(
        name=checkpoint,
        prompt_ids=ids,
        oracle=oracle_samples.mean(axis=1),
        oracle_noise=oracle_samples.var(axis=1, ddof=1) / oracle_n,
        pool=pool,
        pool_count=np.isfinite(pool).sum(axis=1),
        cache=ref[:, :ref_n],
        dropped_no_reference=dropped,
    )
