"""The benchmark's data: a rollouts directory with its reference resolved, split per
checkpoint into the held-out oracle, the pool the estimators draw from, and the cache.

* oracle: the mean of the checkpoint's first ``oracle_n`` samples of each prompt (by
  sample_idx); the estimators never see them;
* pool: the checkpoint's remaining samples;
* cache: the reference policy's first ``ref_n`` samples.

Prompts without any reference sample cannot use the cache: they are dropped and counted.
The oracle is itself noisy: Var(oracle_i) = sigma_i^2 / oracle_n, estimated without bias
by the oracle samples' variance (ddof = 1) over oracle_n.

Memory: a dataset is held as one reward matrix per policy (:class:`PolicyRewards`, about
one to eight bytes per rollout), read from Parquet in record batches, never as a long
frame of rows; see docs/scale.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from basis_bench.errors import InputError
from basis_bench.evaluation.config import named
from basis_bench.guards.locks import publishing
from basis_bench.guards.memory_check import check_rollouts_fit
from basis_bench.rollouts.store import (
    ROLLOUT_COLUMNS,
    dataset_metadata,
    default_dataset,
    file_policies,
    load_rollouts,
    parquet_schema,
    reward_matrix,
    rollout_files,
)
from basis_bench.schema import PROMPTS_FILE
from basis_bench.settings import check_scalar

DEFAULT_DATASET = default_dataset()
REFERENCE_NAME = "reference"
BATCH_ROWS = 1 << 16  # Parquet rows read at a time: the loader's working set is O(this)
SPARSE_FACTOR = 4  # a matrix this many times larger than its rows: sample_idx too sparse


@dataclass(frozen=True)
class PolicyRewards:
    """One policy's rewards: row p of ``matrix`` holds prompt ``prompt_ids[p]``'s samples in
    sample_idx order, NaN-padded on the right. Stored in the narrowest float type that
    holds every value exactly (float16 for 0/1 rewards), so :meth:`rows` returns the same
    float64 values the rows held."""

    prompt_ids: np.ndarray  # (P,) object, sorted
    matrix: np.ndarray  # (P, S)

    @classmethod
    def build(cls, prompt_ids: np.ndarray, matrix: np.ndarray) -> PolicyRewards:
        for dtype in (np.float16, np.float32):
            if _exact_in(matrix, dtype):
                return cls(prompt_ids, matrix.astype(dtype))
        return cls(prompt_ids, matrix)

    def rows(self, prompt_ids: np.ndarray) -> np.ndarray:
        """The (len(prompt_ids), S) float64 rewards of ``prompt_ids``; all NaN for a prompt
        the policy never answered (what :func:`~basis_bench.rollouts.store.reward_matrix` gives)."""
        index = {pid: i for i, pid in enumerate(self.prompt_ids)}
        at = np.fromiter((index.get(p, -1) for p in prompt_ids), np.int64, len(prompt_ids))
        out = self.matrix[np.maximum(at, 0)].astype(np.float64)
        out[at < 0] = np.nan
        return out

    def reward_bounds(self) -> tuple[float, float] | None:
        """(min, max) reward, None without any."""
        if not np.isfinite(self.matrix).any():
            return None
        return float(np.nanmin(self.matrix)), float(np.nanmax(self.matrix))


def _exact_in(matrix: np.ndarray, dtype: type[np.floating[Any]]) -> bool:
    """Whether every value of ``matrix`` survives a round trip through ``dtype`` (NaN
    included); checked BATCH_ROWS values at a time, so its temporaries stay small."""
    rows = max(1, BATCH_ROWS // max(matrix.shape[1], 1))
    for lo in range(0, len(matrix), rows):
        part = matrix[lo : lo + rows]
        if not np.array_equal(part.astype(dtype).astype(np.float64), part, equal_nan=True):
            return False
    return True


Rewards = dict[str, PolicyRewards]
"""Each policy's :class:`PolicyRewards`, by name."""


def rewards_from_frame(df: pl.DataFrame) -> Rewards:
    """Every policy of a rollouts frame in the store's schema as :class:`PolicyRewards`."""
    out: Rewards = {}
    for policy in sorted(df["policy"].unique().to_list()):
        ids = df.filter(pl.col("policy") == policy)["prompt_id"].unique().sort().to_numpy()
        out[policy] = PolicyRewards.build(ids, reward_matrix(df, policy, ids))
    return out


class _Irregular(Exception):
    """Rows the streaming loader leaves to the store's full validator (which names the error)."""


def _batches(files: Sequence[Path], policies: Sequence[str]) -> Iterator[pl.DataFrame]:
    """The four required columns of every file, ``BATCH_ROWS`` rows at a time, cast to the
    schema and restricted to ``policies``; rows the validator would refuse raise _Irregular."""
    for f in files:
        try:
            yield from _file_batches(f, policies)
        except (OSError, pa.ArrowException, pl.exceptions.PolarsError) as err:
            if isinstance(err, OSError) and err.errno:  # the disk's, not the file's
                raise
            raise _Irregular from err  # a corrupt page, a list-typed column: the full reader names it


def _file_batches(f: Path, policies: Sequence[str]) -> Iterator[pl.DataFrame]:
    handle = pq.ParquetFile(f)
    if any(c not in handle.schema_arrow.names for c in ROLLOUT_COLUMNS):
        raise _Irregular
    for batch in handle.iter_batches(BATCH_ROWS, columns=list(ROLLOUT_COLUMNS)):
        df = pl.DataFrame(pl.from_arrow(batch)).with_columns(
            pl.col(c).cast(t, strict=False) for c, t in ROLLOUT_COLUMNS.items()
        )
        if sum(df.null_count().row(0)) or not df["reward"].is_finite().all():
            raise _Irregular
        yield df.filter(pl.col("policy").is_in(list(policies)))


@dataclass
class _Shape:
    """What the first pass learns of one policy: its prompts, widest sample_idx, rows, files."""

    ids: set[str] = field(default_factory=set)
    width: int = 0
    count: int = 0
    files: list[Path] = field(default_factory=list)


def _survey(files: Sequence[Path], policies: Sequence[str]) -> dict[str, _Shape]:
    shapes = {p: _Shape() for p in policies}
    for f in files:
        for df in _batches([f], policies):
            for (policy,), sub in df.group_by("policy"):
                shape, idx = shapes[str(policy)], sub["sample_idx"].to_numpy()
                if idx.min() < 0:
                    raise _Irregular
                shape.ids.update(sub["prompt_id"].unique().to_list())
                shape.width = max(shape.width, int(idx.max()) + 1)
                shape.count += sub.height
                if not shape.files or shape.files[-1] != f:
                    shape.files.append(f)
    return shapes


def _stream_rewards(files: Sequence[Path], policies: Sequence[str]) -> Rewards:
    """A first pass over the files learns each policy's prompts and widest sample_idx; then,
    one policy at a time, its matrix is filled from its files and narrowed. Duplicate keys,
    negative or very sparse sample_idx raise _Irregular."""
    shapes = _survey(files, policies)
    out: Rewards = {}
    for p in policies:
        shape = shapes[p]
        order = np.array(sorted(shape.ids), dtype=object)
        if len(order) * shape.width > SPARSE_FACTOR * shape.count + BATCH_ROWS:
            raise _Irregular
        check_rollouts_fit(  # float64 cells, before they are allocated
            len(order) * shape.width, 8, f"reading policy {p!r}", "evaluate fewer samples"
        )
        m = np.full((len(order), shape.width), np.nan)
        rows = pl.DataFrame({"prompt_id": order.tolist(), "_row": np.arange(len(order))})
        for df in _batches(shape.files, [p]):
            at = df.join(rows, on="prompt_id", how="left")
            m[at["_row"].to_numpy(), at["sample_idx"].to_numpy()] = at["reward"].to_numpy()
        if int(np.isfinite(m).sum()) != shape.count:  # a key written twice
            raise _Irregular
        out[p] = PolicyRewards.build(order, _pack_left(m))
    return out


def _pack_left(m: np.ndarray) -> np.ndarray:
    """Each row's samples moved left in sample_idx order (gaps in sample_idx closed), the
    width cut to the longest row: the columns of :func:`reward_matrix`."""
    present = np.isfinite(m)
    longest = int(present.sum(axis=1).max()) if m.size else 0
    if present[:, :longest].all():
        return m[:, :longest]
    order = np.argsort(~present, axis=1, kind="stable")
    return np.take_along_axis(m, order, axis=1)[:, :longest]


def load_rewards(root: Path, policies: Sequence[str]) -> Rewards:
    """``policies``' rewards under ``root``, streamed from Parquet in bounded memory; data the
    streaming loader does not take (bad rows, duplicate keys, very sparse sample_idx) goes
    through the store's full reader, which names the problem or reads it whole. Read under
    the dataset's publish lock, so an import that replaces policies is seen whole or not
    at all."""
    try:
        with publishing(root, reading=True):
            return _stream_rewards(rollout_files(root), policies)
    except _Irregular:
        df = load_rollouts(root, policies, optional=())  # raises the InputError, if any
        frame = rewards_from_frame(df)
        return {p: frame[p] for p in policies if p in frame}


@dataclass(frozen=True)
class Dataset:
    """The rewards of a rollouts directory, with its reference policy resolved."""

    root: Path
    rewards: Rewards  # the reference's and the checkpoints'
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
    that names it (a folder named x.parquet, a link to nothing, a file cut short, garbage)."""
    for f in files:
        if f.is_dir():
            raise InputError(f"{f} is a folder, not a Parquet file; move it out of the dataset")
        if f.is_symlink() and not f.exists():  # was "a folder in the path does not exist"
            raise InputError(
                f"{f} is a symbolic link to nothing (or a loop); restore its target or remove it"
            )
        if f.exists():
            parquet_schema(f)


def _check_not_inner(root: Path) -> None:
    """Refuse the ``rollouts/`` folder of a dataset given for the dataset: read alone it has
    no prompts table, and a results --out beside it (DATASET/res) passed the inside-the-
    dataset check, then broke the dataset for every later command."""
    real = Path(os.path.realpath(root))  # resolve() raises on a loop; rollout_files names it
    parent = real.parent
    if (
        real.name == "rollouts"
        and (parent / PROMPTS_FILE).is_file()
        and not (real / PROMPTS_FILE).exists()
    ):
        raise InputError(
            f"--rollouts {root} is the rollouts/ folder of the dataset {parent}; give the "
            f"dataset's folder instead (--rollouts {parent}), the one holding prompts.parquet"
        )


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
    _check_not_inner(root)
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
        parts = [p.strip() for c in unknown for p in c.split(",")]
        hint = (  # --estimators takes a list, --checkpoint is repeated
            f"; repeat the option for several: {' '.join(f'--checkpoint {p}' for p in parts)}"
            if all("," in c for c in unknown) and all(p in known for p in parts)
            else ""
        )
        raise InputError(
            f"unknown checkpoint(s) {', '.join(map(repr, unknown))}; known: {', '.join(known) or '(none)'}"
            + hint
        )
    if not wanted:
        raise InputError(f"{root}: no checkpoint policies besides the reference {ref!r}")
    rewards = load_rewards(root, [ref, *wanted])  # rewards only, never the texts
    return Dataset(root, rewards, ref, [ref, *wanted], metadata)


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


def smallest_checkpoint(ds: Dataset) -> tuple[int, int]:
    """The fewest prompts with a reference sample of any checkpoint, and the fewest samples
    of any such prompt of any checkpoint: what the data-derived defaults must fit."""
    known = set(ds.rewards[ds.reference].prompt_ids.tolist())
    prompts, samples = [], []
    for c in ds.checkpoints:
        ids = ds.rewards[c].prompt_ids
        has_ref = np.fromiter((p in known for p in ids), bool, len(ids))
        counts = np.isfinite(ds.rewards[c].matrix[has_ref]).sum(axis=1)
        prompts.append(int(has_ref.sum()))
        samples.append(int(counts.min()) if counts.size else 0)
    return min(prompts), min(samples)


def checkpoint_data(
    ds: Dataset, checkpoint: str, oracle_n: int, ref_n: int | None, min_pool: int
) -> CheckpointData:
    """Split a checkpoint's samples into oracle and pool, and attach the reference cache.

    Every kept prompt must have at least ``oracle_n + min_pool`` samples; otherwise the
    pool is too small and an InputError says by how much. ``ref_n=None`` keeps every
    reference sample.
    """
    check_scalar(oracle_n, named("oracle_n"), int, min_val=2)  # its noise estimate needs a variance
    if ref_n is not None:
        check_scalar(ref_n, named("ref_n"), int, min_val=1)
    ids = ds.rewards[checkpoint].prompt_ids
    ref_ids = ds.rewards[ds.reference].prompt_ids
    known = set(ref_ids.tolist())
    has_ref = np.fromiter((p in known for p in ids), bool, len(ids))
    dropped = int((~has_ref).sum())
    ids = ids[has_ref]
    if ids.size == 0:
        raise InputError(
            f"checkpoint {checkpoint!r}: none of its prompts is in the reference cache ({ds.reference!r})"
        )
    rewards = ds.rewards[checkpoint].rows(ids)
    counts = np.isfinite(rewards).sum(axis=1)
    short = counts < oracle_n + min_pool
    if short.any():
        worst = int(counts.min())
        raise InputError(
            f"checkpoint {checkpoint!r}: the pool is smaller than the group size for {int(short.sum())} "
            f"prompt(s): {worst} samples - {named('oracle_n')} {oracle_n} = {worst - oracle_n} left, {min_pool} needed; "
            f"lower {named('oracle_n')} or {named('group_size')}"
        )
    oracle_samples = rewards[:, :oracle_n]
    pool = rewards[:, oracle_n:]
    # copies, not views: a view would keep the whole float64 (P, S) matrix alive
    pool = pool[:, : int(np.isfinite(pool).sum(axis=1).max())].copy()
    ref = ds.rewards[ds.reference].rows(ids)
    if ref_n is not None and ref.shape[1] < ref_n:
        raise InputError(
            f"{named('ref_n')} {ref_n} asks for more reference samples than the dataset has (at most {ref.shape[1]} per prompt)"
        )
    return CheckpointData(
        name=checkpoint,
        prompt_ids=ids,
        oracle=oracle_samples.mean(axis=1),
        oracle_noise=oracle_samples.var(axis=1, ddof=1) / oracle_n,
        pool=pool,
        pool_count=np.isfinite(pool).sum(axis=1),
        cache=ref[:, :ref_n].copy(),
        dropped_no_reference=dropped,
    )
