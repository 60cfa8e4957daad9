"""The value-estimation benchmark: replay repeated batch draws of stored rollouts.

Protocol (the paper's section 5.1 and appendix A), per checkpoint:

* oracle: the mean of the checkpoint's first ``oracle_n`` samples of each prompt (by
  sample_idx); the estimators never see them;
* pool: the checkpoint's remaining samples; each repeat draws a batch of B prompts
  without replacement and, per prompt, G_max pool samples without replacement (single-
  rollout estimators use the first, GRPO/RLOO(G) the first G, so the G sweep and all
  estimators share one draw);
* cache: the reference policy's first ``ref_n`` samples, turned once into the (K, P)
  table of tilted values and variances (``tilted_moments``) that BASIS-type estimators
  index by batch.

Every registered estimator (:data:`basis_bench.estimators.ESTIMATORS`) is called by name
on ``(R_chunk, B, G)`` arrays, so repeats are vectorised in chunks of
:data:`CHUNK_REPEATS` and memory stays bounded however many repeats run. A group
estimator returns one baseline per rollout; its squared error is the mean over the G
rollouts of (b_ik - oracle_i)^2 and its ``estimate`` column is the first rollout's
baseline (for GRPO all G are equal). Prompts without any reference sample cannot use the
cache: they are dropped, counted in ``run.json`` and printed.

The oracle is itself noisy: Var(oracle_i) = sigma_i^2 / oracle_n, estimated without bias
by the oracle samples' variance (ddof = 1) over oracle_n, i.e. v(1 - v)/(oracle_n - 1)
for binary rewards. Because pool and oracle samples are disjoint,
E (b - oracle)^2 = MSE + Var(oracle), so ``mse_noise_corrected`` subtracts it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from basis_bench import __version__
from basis_bench.bench.trajectory import ESTIMATOR_NAME as TRACKER_NAME
from basis_bench.bench.trajectory import replay_tracker
from basis_bench.errors import InputError
from basis_bench.estimators import (
    ESTIMATORS,
    Estimator,
    EstimatorInput,
    basis_estimate,
    default_betas,
    get,
    refine,
    tilted_moments,
)
from basis_bench.rollouts.store import (
    METADATA_KEY,
    dataset_metadata,
    default_dataset,
    file_policies,
    load_rollouts,
    reward_matrix,
    rollout_files,
)

DEFAULT_DATASET = default_dataset()
REFERENCE_NAME = "reference"
CHUNK_REPEATS = 256
HETEROGENEITY_BATCHES = 500
HETEROGENEITY_BINS = 5
DIFFICULTY_REPEATS = 10
DIFFICULTY_EDGES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
G_SWEEP = (2, 4, 8, 16)
TRACKER_REPEATS = 200  # the tracker replays whole epochs over every checkpoint; 200 gives tight CIs
Z_95 = 1.959963984540054


# --------------------------------------------------------------------------- data


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
class Tilt:
    """The offline table: tilted values and variances of every prompt at every beta."""

    betas: np.ndarray  # (K,)
    values: np.ndarray  # (K, P)
    variances: np.ndarray  # (K, P)

    @classmethod
    def from_cache(cls, cache: np.ndarray, betas: np.ndarray) -> Tilt:
        v, var = tilted_moments(cache, betas)
        return cls(np.asarray(betas, dtype=np.float64), np.asarray(v), np.asarray(var))


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
    if oracle_n < 2:
        raise InputError(
            f"--oracle-n must be at least 2 (its noise estimate needs a variance); got {oracle_n}"
        )
    if ref_n is not None and ref_n < 1:
        raise InputError(f"--ref-n must be at least 1; got {ref_n}")
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


# --------------------------------------------------------------------------- replay


def _stable_seed(seed: int, name: str) -> np.random.SeedSequence:
    digest = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return np.random.SeedSequence([seed, digest])


def draw_batches(
    rng: np.random.Generator, n_prompts: int, batch_size: int, repeats: int
) -> np.ndarray:
    """(repeats, B) prompt indices, each row a uniform draw without replacement."""
    keys = rng.random((repeats, n_prompts))
    return np.argpartition(keys, batch_size - 1, axis=1)[:, :batch_size]


def draw_rollouts(
    rng: np.random.Generator, pool_count: np.ndarray, g: int, width: int
) -> np.ndarray:
    """(..., g) pool columns per entry of ``pool_count`` (...), without replacement, random order."""
    keys = rng.random((*pool_count.shape, width))
    keys[np.arange(width) >= pool_count[..., None]] = np.inf
    cols = np.argpartition(keys, g - 1, axis=-1)[..., :g]
    order = np.argsort(np.take_along_axis(keys, cols, axis=-1), axis=-1)
    return np.take_along_axis(cols, order, axis=-1)


def _accepts(est: Estimator, name: str) -> bool:
    params = inspect.signature(est.fn).parameters.values()
    return any(p.kind is p.VAR_KEYWORD or p.name == name for p in params)


def estimator_options(est: Estimator, options: dict[str, Any]) -> dict[str, Any]:
    """The BASIS options (calibration, criterion, loss, eps, ...) that ``est`` takes.

    They go only to estimators that use the reference cache and accept the keyword, so
    ``--eps`` reaches BASIS's active-set threshold and never another method's own ``eps``.
    """
    if not est.uses_cache:
        return {}
    return {k: v for k, v in options.items() if _accepts(est, k)}


@dataclass
class Series:
    """Per-repeat statistics of one (estimator, rollouts per prompt)."""

    estimator: str
    rollouts_per_prompt: int
    batch_mse: list[np.ndarray] = field(default_factory=list)  # (R,) mean sq err per batch
    extreme: list[np.ndarray] = field(default_factory=list)  # (R,) share of 0/1 baselines

    def add(self, sq_err: np.ndarray, extreme: np.ndarray) -> None:
        """Record a chunk: squared errors (r, B) and 0/1 baseline shares (r,)."""
        self.batch_mse.append(sq_err.mean(axis=1))
        self.extreme.append(extreme)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.concatenate(self.batch_mse), np.concatenate(self.extreme)


@dataclass
class Replay:
    """Everything one checkpoint's replay collects; small whatever the number of repeats."""

    checkpoint: str
    series: dict[tuple[str, int], Series]
    sweep: dict[tuple[str, int], Series]
    batch_noise: np.ndarray  # (R,) mean oracle noise of each batch
    batch_spread: np.ndarray  # (R,) s_b = std of the batch's oracle values
    # estimator, rollouts_per_prompt, oracle, sq_err, noise of the first DIFFICULTY_REPEATS
    difficulty: pl.DataFrame
    beta_counts: np.ndarray  # (K,) how often each beta was chosen
    fixed_beta: np.ndarray  # (2, K) summed squared error of initial and refined values
    fixed_beta_n: int
    betas: np.ndarray


@dataclass(frozen=True)
class ReplaySettings:
    """The knobs of one replay (the CLI's options)."""

    batch_size: int = 64
    repeats: int = 1000
    group_size: int = 8
    seed: int = 0
    basis_options: dict[str, Any] = field(default_factory=dict)
    g_sweep: tuple[int, ...] = G_SWEEP
    extras: bool = True  # beta choices, fixed-beta curve, G sweep, difficulty records


EstimateSink = Callable[[pa.Table], None]


def replay(
    data: CheckpointData,
    tilt: Tilt,
    estimators: Sequence[Estimator],
    settings: ReplaySettings,
    sink: EstimateSink | None = None,
    progress: Callable[[int], None] | None = None,
) -> Replay:
    """Run ``settings.repeats`` batch draws through every estimator, chunk by chunk.

    ``tilt`` must be the table of ``data.cache`` (columns aligned with data's prompts).
    ``sink`` receives each chunk's estimates as an Arrow table; ``progress`` the number of
    repeats done in each chunk.
    """
    b, g, repeats = settings.batch_size, settings.group_size, settings.repeats
    if b < 2:
        raise InputError(
            f"--batch-size must be at least 2 (leave-one-out needs another prompt); got {b}"
        )
    if b > data.n_prompts:
        raise InputError(
            f"--batch-size {b} exceeds the {data.n_prompts} prompts of checkpoint {data.name!r}"
        )
    if repeats < 1:
        raise InputError(f"--repeats must be at least 1; got {repeats}")
    min_pool = int(data.pool_count.min())
    has_group = any(e.group for e in estimators)
    if has_group and g < 2:
        raise InputError(
            f"--group-size must be at least 2 for group estimators (RLOO leaves one out); got {g}"
        )
    if has_group and min_pool < g:
        raise InputError(
            f"checkpoint {data.name!r}: the pool has {min_pool} rollouts for some prompt, smaller than the "
            f"group size {g}; lower --group-size or --oracle-n"
        )
    sweep_gs = (
        sorted({gg for gg in settings.g_sweep if 2 <= gg <= min_pool} | {g})
        if has_group and settings.extras
        else []
    )
    g_max = max([g if has_group else 1, *sweep_gs])
    rr = data.reward_range
    rng = np.random.default_rng(_stable_seed(settings.seed, data.name))
    k = len(tilt.betas)
    series = {
        (e.name, e.rollouts_per_prompt(g)): Series(e.name, e.rollouts_per_prompt(g))
        for e in estimators
    }
    sweep = {(e.name, gg): Series(e.name, gg) for e in estimators if e.group for gg in sweep_gs}
    noise_parts, spread_parts, diff_parts = [], [], []
    beta_counts = np.zeros(k, dtype=np.int64)
    fixed = np.zeros((2, k))
    options = {e.name: estimator_options(e, settings.basis_options) for e in estimators}
    basis_opts = (
        estimator_options(get("basis"), settings.basis_options) if "basis" in ESTIMATORS else {}
    )
    eps_opt = {"eps": basis_opts["eps"]} if "eps" in basis_opts else {}
    prompt_ids = pa.array(data.prompt_ids.astype(str), pa.string())

    for start in range(0, repeats, CHUNK_REPEATS):
        r = min(CHUNK_REPEATS, repeats - start)
        batch = draw_batches(rng, data.n_prompts, b, r)  # (r, B)
        cols = draw_rollouts(
            rng, data.pool_count[batch], g_max, data.pool.shape[1]
        )  # (r, B, g_max)
        rewards = data.pool[batch[..., None], cols]
        oracle = data.oracle[batch]
        noise = data.oracle_noise[batch]
        v_grid, var_grid = tilt.values[:, batch], tilt.variances[:, batch]  # (K, r, B)
        noise_parts.append(noise.mean(axis=1))
        spread_parts.append(oracle.std(axis=1))
        repeat_idx = np.arange(start, start + r)
        first = repeat_idx < DIFFICULTY_REPEATS
        rows: list[pa.Table] = []
        for est in estimators:
            for gg in sweep_gs if est.group and sweep_gs else [est.rollouts_per_prompt(g)]:
                inp = EstimatorInput(rewards[..., :gg], v_grid, var_grid, tilt.betas, rr)
                base = np.asarray(est(inp, **options[est.name]), dtype=np.float64)  # (r, B, gg)
                sq = ((base - oracle[..., None]) ** 2).mean(axis=-1)  # (r, B)
                extreme = ((base == 0) | (base == 1)).mean(axis=(-2, -1))  # (r,)
                key = (est.name, gg)
                for store in (series, sweep):
                    if key in store:
                        store[key].add(sq, extreme)
                if key not in series:
                    continue
                if sink is not None:
                    rows.append(
                        _estimate_rows(
                            data.name,
                            est.name,
                            gg,
                            repeat_idx,
                            batch,
                            base[..., 0],
                            oracle,
                            sq,
                            prompt_ids,
                        )
                    )
                if settings.extras and first.any():
                    diff_parts.append(
                        pl.DataFrame(
                            {
                                "estimator": est.name,
                                "rollouts_per_prompt": gg,
                                "oracle": oracle[first].ravel(),
                                "sq_err": sq[first].ravel(),
                                "noise": noise[first].ravel(),
                            }
                        )
                    )
        if sink is not None and rows:
            sink(pa.concat_tables(rows))
        if settings.extras:
            single = rewards[..., 0]
            _, idx = basis_estimate(
                v_grid, var_grid, single, refine_values=False, reward_range=rr, **basis_opts
            )
            beta_counts += np.bincount(np.asarray(idx).ravel(), minlength=k)
            fixed += _fixed_beta_errors(v_grid, var_grid, single, oracle, rr, **eps_opt)
        if progress is not None:
            progress(r)

    return Replay(
        checkpoint=data.name,
        series=series,
        sweep=sweep,
        batch_noise=np.concatenate(noise_parts),
        batch_spread=np.concatenate(spread_parts),
        difficulty=pl.concat(diff_parts) if diff_parts else pl.DataFrame(),
        beta_counts=beta_counts,
        fixed_beta=fixed,
        fixed_beta_n=repeats * b,
        betas=tilt.betas,
    )


def _fixed_beta_errors(
    v_grid: np.ndarray,
    var_grid: np.ndarray,
    rewards: np.ndarray,
    oracle: np.ndarray,
    reward_range: tuple[float, float] | None,
    **refine_options: Any,
) -> np.ndarray:
    """(2, K) summed squared errors of V^_beta and of its UNB refinement V~_beta, every beta."""
    r = np.broadcast_to(rewards, v_grid.shape)
    refined = np.asarray(
        refine(
            v_grid,
            r,
            variant="unb",
            reward_var=var_grid,
            reward_range=reward_range,
            **refine_options,
        )
    )
    return np.stack(
        [((v_grid - oracle) ** 2).sum(axis=(1, 2)), ((refined - oracle) ** 2).sum(axis=(1, 2))]
    )


ESTIMATES_SCHEMA = pa.schema(
    [
        ("checkpoint", pa.string()),
        ("repeat", pa.int32()),
        ("prompt_id", pa.string()),
        ("estimator", pa.string()),
        ("rollouts_per_prompt", pa.int16()),
        ("estimate", pa.float64()),
        ("oracle", pa.float64()),
        ("sq_err", pa.float64()),
    ]
)


def _estimate_rows(
    checkpoint: str,
    estimator: str,
    g: int,
    repeat_idx: np.ndarray,
    batch: np.ndarray,
    estimate: np.ndarray,
    oracle: np.ndarray,
    sq: np.ndarray,
    prompt_ids: pa.Array,
) -> pa.Table:
    """One chunk's rows of estimates.parquet: (repeat, prompt) in row-major order."""
    n = batch.size
    return pa.table(
        {
            "checkpoint": pa.repeat(pa.scalar(checkpoint), n),
            "repeat": pa.array(np.repeat(repeat_idx, batch.shape[1]).astype(np.int32)),
            "prompt_id": prompt_ids.take(pa.array(batch.ravel())),
            "estimator": pa.repeat(pa.scalar(estimator), n),
            "rollouts_per_prompt": pa.array(np.full(n, g, np.int16)),
            "estimate": pa.array(estimate.ravel()),
            "oracle": pa.array(oracle.ravel()),
            "sq_err": pa.array(sq.ravel()),
        },
        schema=ESTIMATES_SCHEMA,
    )


# --------------------------------------------------------------------------- summaries


def _series_row(s: Series, noise: np.ndarray, batch_size: int) -> dict[str, Any]:
    mse_r, ext_r = s.arrays()
    n = len(mse_r)
    mse = float(mse_r.mean())
    half = Z_95 * float(mse_r.std(ddof=1)) / math.sqrt(n) if n > 1 else math.nan
    return {
        "estimator": s.estimator,
        "rollouts_per_prompt": s.rollouts_per_prompt,
        "mse": mse,
        "mse_noise_corrected": mse - float(noise.mean()),
        "ci_low": mse - half,
        "ci_high": mse + half,
        "extreme_rate": float(ext_r.mean()),
        "n_estimates": n * batch_size,
    }


def summary_table(rep: Replay, batch_size: int) -> pl.DataFrame:
    """summary.csv rows: MSE over all (repeat, prompt) estimates with a normal 95% CI over repeats."""
    rows = [
        {"checkpoint": rep.checkpoint, **_series_row(s, rep.batch_noise, batch_size)}
        for s in rep.series.values()
    ]
    return pl.DataFrame(rows)


def g_sweep_table(rep: Replay, batch_size: int) -> pl.DataFrame:
    """g_sweep.csv rows: group estimators at each G the pool allows."""
    rows = [
        {"checkpoint": rep.checkpoint, **_series_row(s, rep.batch_noise, batch_size)}
        for s in rep.sweep.values()
    ]
    return (
        pl.DataFrame(rows).rename({"rollouts_per_prompt": "group_size"}) if rows else pl.DataFrame()
    )


def bin_index(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin of each value for edges e_0 < ... < e_m: [e_i, e_{i+1}), the last bin closed."""
    return np.clip(np.searchsorted(edges[1:-1], values, side="right"), 0, len(edges) - 2)


def heterogeneity_edges(spread: np.ndarray, bins: int = HETEROGENEITY_BINS) -> np.ndarray:
    """Equal-width edges from the observed min to max of s_b (one bin when all are equal)."""
    lo, hi = float(spread.min()), float(spread.max())
    return np.linspace(lo, hi, bins + 1) if hi > lo else np.array([lo, hi])


def heterogeneity_table(rep: Replay, n_batches: int = HETEROGENEITY_BATCHES) -> pl.DataFrame:
    """by_heterogeneity.csv: the first ``n_batches`` batches binned by s_b = std of their oracle values.

    MSE is averaged over the prompts of a batch, then over the batches of a bin.
    """
    spread = rep.batch_spread[:n_batches]
    edges = heterogeneity_edges(spread)
    bins = bin_index(spread, edges)
    noise = rep.batch_noise[:n_batches]
    rows = []
    for s in rep.series.values():
        mse_r = s.arrays()[0][:n_batches]
        for i in range(len(edges) - 1):
            m = bins == i
            rows.append(
                {
                    "checkpoint": rep.checkpoint,
                    "estimator": s.estimator,
                    "rollouts_per_prompt": s.rollouts_per_prompt,
                    "bin": i,
                    "bin_low": float(edges[i]),
                    "bin_high": float(edges[i + 1]),
                    "n_batches": int(m.sum()),
                    "mse": float(mse_r[m].mean()) if m.any() else math.nan,
                    "mse_noise_corrected": float((mse_r[m] - noise[m]).mean())
                    if m.any()
                    else math.nan,
                }
            )
    return pl.DataFrame(rows)


def difficulty_table(rep: Replay) -> pl.DataFrame:
    """by_difficulty.csv: estimates of the first 10 repeats binned by oracle value
    ([0,.2) [.2,.4) [.4,.6) [.6,.8) [.8,1]); MSE over the estimates in each bin."""
    edges = np.asarray(DIFFICULTY_EDGES)
    d = rep.difficulty.with_columns(
        pl.Series("bin", bin_index(rep.difficulty["oracle"].to_numpy(), edges))
    )
    grid = (
        d.select("estimator", "rollouts_per_prompt")
        .unique(maintain_order=True)
        .join(pl.DataFrame({"bin": np.arange(len(edges) - 1)}), how="cross")
    )
    agg = d.group_by("estimator", "rollouts_per_prompt", "bin").agg(
        pl.len().alias("n_estimates"),
        pl.col("sq_err").mean().alias("mse"),
        (pl.col("sq_err") - pl.col("noise")).mean().alias("mse_noise_corrected"),
    )
    out = grid.join(agg, on=["estimator", "rollouts_per_prompt", "bin"], how="left").with_columns(
        pl.col("n_estimates").fill_null(0),
        pl.col("bin").map_elements(lambda i: edges[i], return_dtype=pl.Float64).alias("bin_low"),
        pl.col("bin")
        .map_elements(lambda i: edges[i + 1], return_dtype=pl.Float64)
        .alias("bin_high"),
    )
    return out.select(
        pl.lit(rep.checkpoint).alias("checkpoint"),
        "estimator",
        "rollouts_per_prompt",
        "bin",
        "bin_low",
        "bin_high",
        pl.col("n_estimates").cast(pl.Int64),
        "mse",
        "mse_noise_corrected",
    )


def beta_table(rep: Replay) -> pl.DataFrame:
    """beta_choice.csv: how often online calibration chose each beta (one choice per repeat)."""
    total = max(int(rep.beta_counts.sum()), 1)
    return pl.DataFrame(
        {
            "checkpoint": rep.checkpoint,
            "beta_index": np.arange(len(rep.betas)),
            "beta": rep.betas,
            "count": rep.beta_counts,
            "share": rep.beta_counts / total,
        }
    )


def fixed_beta_table(rep: Replay) -> pl.DataFrame:
    """fixed_beta.csv (Fig. 2): MSE of the initial V^_beta and refined V~_beta at each fixed beta."""
    mse = rep.fixed_beta / rep.fixed_beta_n
    noise = float(rep.batch_noise.mean())
    return pl.DataFrame(
        {
            "checkpoint": rep.checkpoint,
            "beta": rep.betas,
            "initial_mse": mse[0],
            "refined_mse": mse[1],
            "initial_mse_noise_corrected": mse[0] - noise,
            "refined_mse_noise_corrected": mse[1] - noise,
        }
    )


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class EvaluateConfig:
    """Options of ``basis-bench evaluate`` (see its --help)."""

    rollouts: str | None = None
    checkpoints: tuple[str, ...] = ()
    reference: str | None = None
    estimators: tuple[str, ...] = ()  # empty = every registered estimator
    batch_size: int = 64
    repeats: int = 1000
    group_size: int = 8
    oracle_n: int = 256
    ref_n: int = 64
    seed: int = 0
    grid_size: int = 32
    basis_options: dict[str, Any] = field(default_factory=dict)
    write_estimates: bool = True


def resolve_estimators(names: Iterable[str]) -> list[Estimator]:
    """Registered estimators by name (all of them for an empty list), in registry order.

    The cross-step SPO tracker is not a per-batch estimator; :func:`wants_tracker` says
    whether it was asked for, and it is skipped here.
    """
    names = [n for n in names if n != TRACKER_NAME]
    if not names or names == ["all"]:
        return list(ESTIMATORS.values())
    chosen = [get(n) for n in dict.fromkeys(names)]
    return chosen


def wants_tracker(names: Iterable[str]) -> bool:
    """The SPO tracker runs with ``all`` (or no names) and when named."""
    names = list(names)
    return not names or "all" in names or TRACKER_NAME in names


@dataclass(frozen=True)
class EvaluateResult:
    out: Path
    summary: pl.DataFrame
    run: dict[str, Any]


def _write_csv(df: pl.DataFrame, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    df.write_csv(tmp, float_precision=10)
    os.replace(tmp, path)


class _EstimatesWriter:
    """Streams chunks of estimates into one Parquet file, renamed into place when closed."""

    def __init__(self, path: Path, metadata: dict[str, Any]) -> None:
        self.path = path
        self.tmp = path.with_name(path.name + ".tmp")
        schema = ESTIMATES_SCHEMA.with_metadata(
            {METADATA_KEY: json.dumps(metadata, sort_keys=True, default=str)}
        )
        self.writer = pq.ParquetWriter(self.tmp, schema, compression="zstd")

    def __call__(self, table: pa.Table) -> None:
        self.writer.write_table(table.replace_schema_metadata(self.writer.schema.metadata))

    def close(self) -> None:
        self.writer.close()
        os.replace(self.tmp, self.path)


def evaluate(
    cfg: EvaluateConfig,
    out: str | os.PathLike[str],
    progress: Callable[[str, int, int], None] | None = None,
) -> EvaluateResult:
    """Run the benchmark and write its files to ``out``.

    Files: estimates.parquet, summary.csv, g_sweep.csv, by_heterogeneity.csv,
    by_difficulty.csv, beta_choice.csv, fixed_beta.csv and run.json (settings, dataset
    label, prompts per checkpoint, prompts dropped for lack of a reference sample).
    ``progress(checkpoint, done, total)`` is called after each chunk of repeats.
    """
    estimators = resolve_estimators(cfg.estimators)
    run_tracker = wants_tracker(cfg.estimators)
    ds = open_dataset(cfg.rollouts, cfg.reference, cfg.checkpoints)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    has_group = any(e.group for e in estimators)
    betas = default_betas(cfg.grid_size)
    settings = ReplaySettings(
        cfg.batch_size, cfg.repeats, cfg.group_size, cfg.seed, dict(cfg.basis_options)
    )
    datas = [
        checkpoint_data(ds, c, cfg.oracle_n, cfg.ref_n, cfg.group_size if has_group else 1)
        for c in ds.checkpoints
    ]
    run: dict[str, Any] = {
        "package_version": __version__,
        "rollouts": str(ds.root),
        "dataset_label": ds.label,
        "simulated": ds.simulated,
        "reference": ds.reference,
        "config": {**asdict(cfg), "rollouts": str(ds.root)},
        "estimators": [e.name for e in estimators],
        "betas": [float(x) for x in betas],
        "chunk_repeats": CHUNK_REPEATS,
        "estimates": "one row per (repeat, prompt, estimator); for group estimators sq_err is the mean "
        "over the G rollouts' baselines and estimate is the first rollout's baseline",
        "checkpoints": {
            d.name: {
                "prompts": d.n_prompts,
                "dropped_no_reference": d.dropped_no_reference,
                "min_pool": int(d.pool_count.min()),
            }
            for d in datas
        },
    }
    if not cfg.write_estimates:  # never leave an earlier run's rows beside this run's tables
        (out / "estimates.parquet").unlink(missing_ok=True)
    writer = _EstimatesWriter(out / "estimates.parquet", run) if cfg.write_estimates else None
    tables: dict[str, list[pl.DataFrame]] = {
        k: []
        for k in (
            "summary",
            "g_sweep",
            "by_heterogeneity",
            "by_difficulty",
            "beta_choice",
            "fixed_beta",
        )
    }
    try:
        for d in datas:
            tilt = Tilt.from_cache(d.cache, betas)
            done = 0

            def tick(n: int, name: str = d.name) -> None:
                nonlocal done
                done += n
                if progress is not None:
                    progress(name, done, cfg.repeats)

            rep = replay(d, tilt, estimators, settings, sink=writer, progress=tick)
            tables["summary"].append(summary_table(rep, cfg.batch_size))
            tables["g_sweep"].append(g_sweep_table(rep, cfg.batch_size))
            tables["by_heterogeneity"].append(heterogeneity_table(rep))
            tables["by_difficulty"].append(difficulty_table(rep))
            tables["beta_choice"].append(beta_table(rep))
            tables["fixed_beta"].append(fixed_beta_table(rep))
        if run_tracker:  # its own replay: one tracker per repeat, across the checkpoints in order
            tables["summary"].append(
                replay_tracker(
                    ds.rollouts, ds.reference, ds.checkpoints, batch_size=cfg.batch_size,
                    repeats=min(cfg.repeats, TRACKER_REPEATS), oracle_n=cfg.oracle_n,
                    ref_n=cfg.ref_n, seed=cfg.seed,
                ).select(tables["summary"][0].columns)
            )  # fmt: skip
            run["tracker"] = {
                "checkpoint_order": ds.checkpoints,
                "repeats": min(cfg.repeats, TRACKER_REPEATS),
            }
    except BaseException:
        if writer is not None:
            writer.writer.close()
            writer.tmp.unlink(missing_ok=True)
        raise
    if writer is not None:
        writer.close()
    frames = {
        k: pl.concat([t for t in v if t.height]) if any(t.height for t in v) else pl.DataFrame()
        for k, v in tables.items()
    }
    for name, df in frames.items():
        if df.height:
            _write_csv(df, out / f"{name}.csv")
    run = json.loads(json.dumps(run, default=str))  # as run.json will read back
    tmp = out / "run.json.tmp"
    tmp.write_text(json.dumps(run, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, out / "run.json")
    return EvaluateResult(out, frames["summary"], run)
