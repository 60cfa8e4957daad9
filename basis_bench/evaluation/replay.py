"""The replay engine: repeated batch draws of a checkpoint's pool through every estimator.

Each repeat draws a batch of B prompts without replacement and, per prompt, G_max pool
samples without replacement (single-rollout estimators use the first, GRPO/RLOO(G) the
first G, so the G sweep and all estimators share one draw). The cache's tilt table
(:class:`~basis_bench.estimators.TiltTable`) is indexed by batch. Every estimator is
called on ``(R_chunk, B, G)`` arrays with its own options object, so repeats are
vectorised in chunks of :data:`CHUNK_REPEATS` and memory stays bounded however many
repeats run. A group estimator returns one baseline per rollout; its squared error is the
mean over the G rollouts of (b_ik - oracle_i)^2 and its ``estimate`` column is the first
rollout's baseline (for GRPO all G are equal).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from basis_bench.errors import InputError
from basis_bench.estimators import (
    BasisOptions,
    Estimator,
    EstimatorInput,
    TiltTable,
    refine,
)
from basis_bench.estimators.basis import calibrated_index
from basis_bench.evaluation.config import named
from basis_bench.evaluation.dataset import CheckpointData

CHUNK_REPEATS = 256
KEPT_REPEATS = 500
"""Per-repeat values kept for the first KEPT_REPEATS repeats only (by_heterogeneity.csv bins
the first 500 batches); every other statistic is a running sum, so a replay's memory stays
flat however many repeats run."""
BATCH_KEYS = 1 << 20  # sort keys drawn at a time for the batches: 8 MiB, whatever P
DIFFICULTY_REPEATS = 10
G_SWEEP = (2, 4, 8, 16)


def _stable_seed(seed: int, name: str) -> np.random.SeedSequence:
    digest = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return np.random.SeedSequence([seed, digest])


def draw_batches(
    rng: np.random.Generator, n_prompts: int, batch_size: int, repeats: int
) -> np.ndarray:
    """(repeats, B) prompt indices, each row a uniform draw without replacement: the B
    smallest of P sort keys. The keys of ``rng.random((repeats, P))`` are drawn
    BATCH_KEYS at a time (whole rows: the same numbers, one row after another), so the
    sort keys take O(BATCH_KEYS) memory, not O(repeats x P)."""
    out = np.empty((repeats, batch_size), dtype=np.intp)
    rows = max(1, BATCH_KEYS // max(n_prompts, 1))
    for lo in range(0, repeats, rows):
        keys = rng.random((min(rows, repeats - lo), n_prompts))
        out[lo : lo + len(keys)] = np.argpartition(keys, batch_size - 1, axis=1)[:, :batch_size]
    return out


def draw_rollouts(
    rng: np.random.Generator, pool_count: np.ndarray, g: int, width: int
) -> np.ndarray:
    """(..., g) pool columns per entry of ``pool_count`` (...), without replacement, random order."""
    return pick_rollouts(rng.random((*pool_count.shape, width)), pool_count, g)


def pick_rollouts(keys: np.ndarray, pool_count: np.ndarray, g: int) -> np.ndarray:
    """:func:`draw_rollouts` from given uniform ``keys`` (..., width): the g smallest keys
    among each entry's first ``pool_count`` columns, in key order (``keys`` is overwritten)."""
    width = keys.shape[-1]
    keys[np.arange(width) >= pool_count[..., None]] = np.inf
    cols = np.argpartition(keys, g - 1, axis=-1)[..., :g]
    order = np.argsort(np.take_along_axis(keys, cols, axis=-1), axis=-1)
    return np.take_along_axis(cols, order, axis=-1)


@dataclass
class Moments:
    """Count, mean and sum of squared deviations M2 of a stream of values, merged chunk by
    chunk (Chan, Golub and LeVeque): mean += d k / n, M2 += M2_chunk + d^2 n_old k / n with
    d = chunk mean - mean."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: np.ndarray) -> None:
        k = x.size
        if not k:
            return
        mu = float(x.mean())
        delta, total = mu - self.mean, self.n + k
        self.mean += delta * k / total
        self.m2 += float(((x - mu) ** 2).sum()) + delta**2 * self.n * k / total
        self.n = total

    def std(self) -> float:
        """Sample standard deviation (ddof = 1); NaN below two values."""
        return math.sqrt(self.m2 / (self.n - 1)) if self.n > 1 else math.nan


@dataclass
class Kept:
    """The first KEPT_REPEATS values of a per-repeat stream."""

    chunks: list[np.ndarray] = field(default_factory=list)
    size: int = 0

    def add(self, x: np.ndarray) -> None:
        if self.size < KEPT_REPEATS:
            self.chunks.append(x[: KEPT_REPEATS - self.size])
            self.size += len(self.chunks[-1])

    def array(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0)


@dataclass
class Series:
    """Per-repeat statistics of one (estimator, rollouts per prompt): the running moments of
    each batch's mean squared error and 0/1 baseline share, and the first batches' MSE."""

    estimator: str
    rollouts_per_prompt: int
    batch_mse: Moments = field(default_factory=Moments)
    extreme: Moments = field(default_factory=Moments)
    first_mse: Kept = field(default_factory=Kept)

    @classmethod
    def of(cls, estimator: str, g: int, batch_mse: np.ndarray, extreme: np.ndarray) -> Series:
        """A series from whole arrays of per-batch MSE and 0/1 shares (R,)."""
        s = cls(estimator, g)
        s.record(batch_mse, extreme)
        return s

    def add(self, sq_err: np.ndarray, extreme: np.ndarray) -> None:
        """Record a chunk: squared errors (r, B) and 0/1 baseline shares (r,)."""
        self.record(sq_err.mean(axis=1), extreme)

    def record(self, batch_mse: np.ndarray, extreme: np.ndarray) -> None:
        self.batch_mse.add(batch_mse)
        self.extreme.add(extreme)
        self.first_mse.add(batch_mse)


@dataclass
class Replay:
    """Everything one checkpoint's replay collects; small whatever the number of repeats."""

    checkpoint: str
    series: dict[tuple[str, int], Series]
    sweep: dict[tuple[str, int], Series]
    noise: Moments  # of each batch's mean oracle noise
    spread: Moments  # of each batch's mean V(1 - V), noise-corrected
    batch_noise: np.ndarray  # (min(R, KEPT_REPEATS),) mean oracle noise of the first batches
    batch_spread: np.ndarray  # (min(R, KEPT_REPEATS),) s_b = std of their oracle values
    # estimator, rollouts_per_prompt, oracle, sq_err, noise of the first DIFFICULTY_REPEATS
    difficulty: pl.DataFrame
    beta_counts: np.ndarray  # (K,) how often each beta was chosen
    fixed_beta: np.ndarray  # (2, K) summed squared error of initial and refined values
    fixed_beta_n: int
    betas: np.ndarray


@dataclass(frozen=True)
class ReplaySettings:
    """The knobs of one replay (the CLI's options).

    ``options``: each estimator's options object by name (an estimator missing from it
    uses its registered defaults); ``beta_options``: the BASIS options of the extras (the
    beta choices and the fixed-beta curve).
    """

    batch_size: int = 64
    repeats: int = 1000
    group_size: int = 8
    seed: int = 0
    options: Mapping[str, Any] = field(default_factory=dict)
    beta_options: BasisOptions = field(default_factory=BasisOptions)
    g_sweep: tuple[int, ...] = G_SWEEP
    extras: bool = True  # beta choices, fixed-beta curve, G sweep, difficulty records


EstimateSink = Callable[[pa.Table], None]

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


@dataclass(frozen=True)
class _Chunk:
    """One chunk of r repeats: the drawn batches, their rollouts and grids."""

    repeat_idx: np.ndarray  # (r,)
    batch: np.ndarray  # (r, B) prompt indices
    rewards: np.ndarray  # (r, B, g_max)
    oracle: np.ndarray  # (r, B)
    noise: np.ndarray  # (r, B)
    v_grid: np.ndarray  # (K, r, B)
    var_grid: np.ndarray  # (K, r, B)

    @property
    def first(self) -> np.ndarray:
        """Repeats recorded for the difficulty table."""
        return self.repeat_idx < DIFFICULTY_REPEATS


@dataclass(frozen=True)
class _Plan:
    """What a replay computes: batch size, group sizes, the sweep, the estimators' options."""

    b: int
    g: int
    g_max: int
    sweep_gs: list[int]
    options: dict[str, Any]


def _plan(data: CheckpointData, estimators: Sequence[Estimator], settings: ReplaySettings) -> _Plan:
    """Check the settings against the checkpoint's data and decide the group sizes."""
    b, g = settings.batch_size, settings.group_size
    if b < 2:
        raise InputError(
            f"{named('batch_size')} must be at least 2 (leave-one-out needs another prompt); got {b}"
        )
    if b > data.n_prompts:
        raise InputError(
            f"{named('batch_size')} {b} exceeds the {data.n_prompts} prompts of checkpoint {data.name!r}"
        )
    if settings.repeats < 1:
        raise InputError(f"{named('repeats')} must be at least 1; got {settings.repeats}")
    min_pool = int(data.pool_count.min())
    has_group = any(e.group for e in estimators)
    if has_group and g < 2:
        raise InputError(
            f"{named('group_size')} must be at least 2 for group estimators (RLOO leaves one out); got {g}"
        )
    if has_group and min_pool < g:
        raise InputError(
            f"checkpoint {data.name!r}: the pool has {min_pool} rollouts for some prompt, smaller than the "
            f"group size {g}; lower {named('group_size')} or {named('oracle_n')}"
        )
    sweep_gs = (
        sorted({gg for gg in settings.g_sweep if 2 <= gg <= min_pool} | {g})
        if has_group and settings.extras
        else []
    )
    options = {e.name: e.parse_options(settings.options.get(e.name)) for e in estimators}
    return _Plan(b, g, max([g if has_group else 1, *sweep_gs]), sweep_gs, options)


class _Collector:
    """Accumulates one checkpoint's replay chunk by chunk."""

    def __init__(
        self,
        data: CheckpointData,
        tilt: TiltTable,
        estimators: Sequence[Estimator],
        settings: ReplaySettings,
        plan: _Plan,
    ) -> None:
        self.data, self.tilt, self.settings, self.plan = data, tilt, settings, plan
        self.estimators = list(estimators)
        g = plan.g
        self.series = {
            (e.name, e.rollouts_per_prompt(g)): Series(e.name, e.rollouts_per_prompt(g))
            for e in estimators
        }
        self.sweep = {
            (e.name, gg): Series(e.name, gg) for e in estimators if e.group for gg in plan.sweep_gs
        }
        self.noise, self.spread = Moments(), Moments()
        self.first_noise, self.first_spread = Kept(), Kept()
        self.difficulty: list[pl.DataFrame] = []
        k = len(tilt.betas)
        self.beta_counts = np.zeros(k, dtype=np.int64)
        self.fixed = np.zeros((2, k))
        self.prompt_ids = pa.array(data.prompt_ids.astype(str), pa.string())

    def group_sizes(self, est: Estimator) -> list[int]:
        if est.group and self.plan.sweep_gs:
            return self.plan.sweep_gs
        return [est.rollouts_per_prompt(self.plan.g)]

    def chunk(self, c: _Chunk, sink: EstimateSink | None) -> None:
        """Every estimator on one chunk, then the extras."""
        noise = c.noise.mean(axis=1)
        self.noise.add(noise)
        self.spread.add((c.oracle * (1 - c.oracle) + c.noise).mean(axis=1))
        self.first_noise.add(noise)
        self.first_spread.add(c.oracle.std(axis=1))
        rows: list[pa.Table] = []
        for est in self.estimators:
            for gg in self.group_sizes(est):
                table = self.estimate(est, gg, c, sink is not None)
                if table is not None:
                    rows.append(table)
        if sink is not None and rows:
            sink(pa.concat_tables(rows))
        if self.settings.extras:
            self.extras(c)

    def estimate(self, est: Estimator, gg: int, c: _Chunk, want_rows: bool) -> pa.Table | None:
        """One estimator at one group size: record its errors; its estimate rows if wanted."""
        rr = self.data.reward_range
        inp = EstimatorInput(c.rewards[..., :gg], c.v_grid, c.var_grid, self.tilt.betas, rr)
        base = np.asarray(est(inp, self.plan.options[est.name]), dtype=np.float64)  # (r, B, gg)
        sq = ((base - c.oracle[..., None]) ** 2).mean(axis=-1)  # (r, B)
        extreme = ((base == 0) | (base == 1)).mean(axis=(-2, -1))  # (r,)
        key = (est.name, gg)
        for store in (self.series, self.sweep):
            if key in store:
                store[key].add(sq, extreme)
        if key not in self.series:
            return None
        if self.settings.extras and c.first.any():
            self.difficulty.append(
                pl.DataFrame(
                    {
                        "estimator": est.name,
                        "rollouts_per_prompt": gg,
                        "oracle": c.oracle[c.first].ravel(),
                        "sq_err": sq[c.first].ravel(),
                        "noise": c.noise[c.first].ravel(),
                    }
                )
            )
        if not want_rows:
            return None
        return _estimate_rows(
            self.data.name, est.name, gg, c.repeat_idx, c.batch, base[..., 0], c.oracle, sq,
            self.prompt_ids,
        )  # fmt: skip

    def extras(self, c: _Chunk) -> None:
        """The calibrated beta of each batch and the fixed-beta curve."""
        rr = self.data.reward_range
        opts = self.settings.beta_options
        inp = EstimatorInput(c.rewards[..., :1], c.v_grid, c.var_grid, self.tilt.betas, rr)
        idx = calibrated_index(inp, opts)
        self.beta_counts += np.bincount(np.asarray(idx).ravel(), minlength=len(self.tilt.betas))
        single = c.rewards[..., 0]
        self.fixed += _fixed_beta_errors(c.v_grid, c.var_grid, single, c.oracle, rr, opts.eps)

    def result(self, repeats: int) -> Replay:
        return Replay(
            checkpoint=self.data.name,
            series=self.series,
            sweep=self.sweep,
            noise=self.noise,
            spread=self.spread,
            batch_noise=self.first_noise.array(),
            batch_spread=self.first_spread.array(),
            difficulty=pl.concat(self.difficulty) if self.difficulty else pl.DataFrame(),
            beta_counts=self.beta_counts,
            fixed_beta=self.fixed,
            fixed_beta_n=repeats * self.plan.b,
            betas=self.tilt.betas,
        )


def replay(
    data: CheckpointData,
    tilt: TiltTable,
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
    plan = _plan(data, estimators, settings)
    collect = _Collector(data, tilt, estimators, settings, plan)
    rng = np.random.default_rng(_stable_seed(settings.seed, data.name))
    repeats = settings.repeats
    for start in range(0, repeats, CHUNK_REPEATS):
        r = min(CHUNK_REPEATS, repeats - start)
        batch = draw_batches(rng, data.n_prompts, plan.b, r)  # (r, B)
        cols = draw_rollouts(rng, data.pool_count[batch], plan.g_max, data.pool.shape[1])
        v_grid, var_grid = tilt.gather(batch)  # (K, r, B)
        chunk = _Chunk(
            np.arange(start, start + r),
            batch,
            data.pool[batch[..., None], cols],
            data.oracle[batch],
            data.oracle_noise[batch],
            v_grid,
            var_grid,
        )
        collect.chunk(chunk, sink)
        if progress is not None:
            progress(r)
    return collect.result(repeats)


def _fixed_beta_errors(
    v_grid: np.ndarray,
    var_grid: np.ndarray,
    rewards: np.ndarray,
    oracle: np.ndarray,
    reward_range: tuple[float, float] | None,
    eps: float,
) -> np.ndarray:
    """(2, K) summed squared errors of V^_beta and of its UNB refinement V~_beta, every beta."""
    r = np.broadcast_to(rewards, v_grid.shape)
    refined = np.asarray(
        refine(v_grid, r, variant="unb", eps=eps, reward_var=var_grid, reward_range=reward_range)
    )
    return np.stack(
        [((v_grid - oracle) ** 2).sum(axis=(1, 2)), ((refined - oracle) ** 2).sum(axis=(1, 2))]
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
