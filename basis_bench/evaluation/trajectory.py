"""The trajectory replay's epoch schedule: every estimator over the stored checkpoints in
training order, each checkpoint a fixed number of epochs over the prompts.

A one-step replay sees one checkpoint at a time; training is a sequence of checkpoints in
which a prompt comes back once per epoch, and stateful estimators (the SPO tracker,
``basis_memory``, BASIS with ``previous`` calibration) carry what they saw before. The
replay, per repeat (R repeats run as parallel streams of one
:class:`~basis_bench.estimators.StepEstimator` each, so the Python loop is over steps and
estimators only, never over prompts or repeats; an estimator that carries nothing from one
step to the next takes a block of steps in one call, so the time stays linear in prompts
when memory splits the streams into several passes; estimators whose states differ in size
by much run in separate sets of passes, each drawing the same rollouts):

* every estimator starts from its initial state (built from the reference cache: the
  reference policy's first ``ref_n`` samples of each prompt);
* for each checkpoint in order, run ``epochs_per_checkpoint`` epochs; an epoch shuffles the
  prompts and walks them in batches of B (a last partial batch is dropped, like a training
  data loader with drop_last); each visit of a prompt draws fresh rewards from the
  checkpoint's pool: one for single-rollout estimators, G (without replacement) for the
  group ones, all estimators sharing the draw (the single ones take the first); each
  step's baselines are scored against the checkpoint's oracle, then the state moves on.

With ``blend``, the policy moves from each checkpoint to the next over the checkpoint's
epochs instead of jumping: in epoch e (0-based) of E, each rollout comes from the next
checkpoint with probability w = e / E, else from this one (a mixture policy, a real policy
whose value is (1 - w) V_c + w V_{c+1}, the oracle used; its noise (1 - w)^2 and w^2 times
the two oracles' noise). The last checkpoint has no next and stays put. Column
``next_share`` is w (its mean over the epochs in checkpoint rows); 0 without blending.

Oracle and pool follow ``basis-bench evaluate``: the oracle is the mean of a checkpoint's
first ``oracle_n`` samples (by sample_idx), the pool the rest. Only prompts with a reference
sample and rollouts at every checkpoint take part
(:func:`~basis_bench.evaluation.replay_plan.shared_prompts`). Pool draws are
with replacement across visits. The result has one row per (checkpoint, epoch, estimator)
(scope ``epoch``) and one per (checkpoint, estimator) over its epochs (scope
``checkpoint``): MSE, noise-corrected MSE (minus the oracle's own variance), a normal 95%
CI over repeats, and the share of baselines exactly 0 or 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from basis_bench.errors import InputError
from basis_bench.estimators import Estimator, StepEstimator
from basis_bench.evaluation.config import named
from basis_bench.evaluation.dataset import Rewards
from basis_bench.evaluation.gradient import closed_form_scale
from basis_bench.evaluation.replay import pick_rollouts
from basis_bench.evaluation.replay_plan import (
    ReplayPlan,
    ReplayStart,
    reward_range,
    small_pages,
    stream_sets,
    summarise,
)
from basis_bench.guards.memory_check import Size, check_sizes

BLOCK_DRAWS = 1 << 22  # uniforms drawn at a time in an epoch: its memory, whatever the prompts
STATELESS_VISITS = 1 << 14  # visits per call of a stateless estimator: a one-step replay chunk's


class _Split(NamedTuple):
    """A checkpoint's oracle (P,), the oracle's noise (P,), its pool (P, S) and pool sizes (P,)."""

    oracle: np.ndarray
    noise: np.ndarray
    pool: np.ndarray
    pool_count: np.ndarray


def _split(rewards: np.ndarray, oracle_n: int, checkpoint: str, need: int) -> _Split:
    """Oracle mean, oracle noise, pool and pool sizes of a (P, S) NaN-padded reward matrix."""
    counts = np.isfinite(rewards).sum(axis=1)
    if counts.min() < oracle_n + need:
        raise InputError(
            f"checkpoint {checkpoint!r}: a prompt has {int(counts.min())} samples, fewer than "
            f"oracle-n {oracle_n} + {need} (the pool needs at least {need}); lower oracle_n"
        )
    oracle = rewards[:, :oracle_n]
    return _Split(
        oracle.mean(axis=1),
        oracle.var(axis=1, ddof=1) / oracle_n,
        rewards[:, oracle_n:].copy(),  # not a view: the oracle columns are freed
        counts - oracle_n,
    )


@dataclass(frozen=True)
class EpochSchedule:
    """The epoch schedule's settings: B prompts a step, epochs per checkpoint, the
    oracle's samples per prompt (the first ``oracle_n``; the pool is the rest) and whether
    to blend each checkpoint into the next over its epochs."""

    batch_size: int = 64
    epochs_per_checkpoint: int = 1
    oracle_n: int = 256
    blend: bool = False


@dataclass
class _Track:
    """One estimator's parallel streams in one pass."""

    step: StepEstimator
    g: int
    extreme_last: float = 0.0  # 0/1 baselines of the latest epoch, per prompt (/ G)
    curve: list[float] = field(default_factory=list)  # summed squared error of each step


@dataclass
class _Totals:
    """What the passes add up, per (checkpoint, epoch) e: each repeat's summed squared error
    (E, R) and the 0/1 baselines per estimator, the oracle noise summed over the visits, the
    share of the next checkpoint; and each estimator's summed squared error per step."""

    sq: dict[str, np.ndarray]
    extreme: dict[str, np.ndarray]
    noise: np.ndarray
    share: np.ndarray
    curve: dict[str, np.ndarray]
    spread: np.ndarray  # V(1 - V) summed over the visits (noise-corrected)


def check_blend(epochs_per_checkpoint: int, n_checkpoints: int) -> None:
    """Blending moves from one checkpoint to the next over its epochs: it needs both."""
    if epochs_per_checkpoint < 2 or n_checkpoints < 2:
        raise InputError(
            "blending moves from one checkpoint to the next over its epochs: it needs at least "
            f"2 checkpoints and 2 epochs per checkpoint; got {n_checkpoints} and "
            f"{epochs_per_checkpoint}"
        )


def _check(
    plan: ReplayPlan, sched: EpochSchedule, estimators: Sequence[Estimator], p: int,
    n_checkpoints: int,
) -> int:  # fmt: skip
    """Validate the settings; the number of rollouts drawn per visit (G_max)."""
    if sched.oracle_n < 2:
        raise InputError(
            f"oracle_n must be at least 2 (its noise estimate needs a variance); got {sched.oracle_n}"
        )
    if plan.ref_n < 1 or plan.repeats < 1 or sched.epochs_per_checkpoint < 1:
        raise InputError("ref_n, repeats and epochs_per_checkpoint must be at least 1")
    if not 1 <= sched.batch_size <= p:
        raise InputError(
            f"batch_size must be in [1, {p}] (the prompts every checkpoint shares); got {sched.batch_size}"
        )
    if not estimators:
        raise InputError("trajectory replay needs at least one estimator")
    if sched.blend:
        check_blend(sched.epochs_per_checkpoint, n_checkpoints)
    has_group = any(e.group for e in estimators)
    if has_group and plan.group_size < 2:
        raise InputError(f"group estimators need group_size >= 2; got {plan.group_size}")
    return plan.group_size if has_group else 1


# Per epoch, estimator and repeat the summed squared error (float64); per epoch and
# estimator its table rows (a dict per scope, then polars); per replayed step of an epoch
# and estimator a point of its curve (a Python float in a list).
EPOCH_ROW_BYTES = 4096
CURVE_POINT_BYTES = 40


def check_epoch_sizes(
    sched: EpochSchedule, repeats: int, checkpoints: int, estimators: int, prompts: int
) -> int:
    """The epoch replay's ``epochs_per_checkpoint`` against the memory budget before
    anything is allocated (``--trajectory-epochs 10^9`` asked numpy for 14.6 TiB, a
    MemoryError traceback)."""
    steps = max(prompts // max(sched.batch_size, 1), 1)
    per_epoch = checkpoints * (
        16 + estimators * (8 * repeats + 8 + EPOCH_ROW_BYTES + CURVE_POINT_BYTES * steps)
    )
    epochs = Size(named("trajectory_epochs"), sched.epochs_per_checkpoint, per_epoch)
    return check_sizes("this trajectory replay", [epochs])


@small_pages()
def replay_trajectory(
    rollouts: pl.DataFrame | Rewards,
    reference: str,
    checkpoints: Sequence[str],
    estimators: Sequence[str | Estimator],
    plan: ReplayPlan | None = None,
    schedule: EpochSchedule | None = None,
    progress: Callable[[str, int], None] | None = None,
    prompts: pl.DataFrame | None = None,
) -> tuple[pl.DataFrame, dict[str, np.ndarray]]:
    """Replay ``estimators`` over ``checkpoints`` in order; rows per epoch and per checkpoint.

    ``rollouts`` is a frame in the store's schema or a dataset's
    :class:`~basis_bench.evaluation.dataset.PolicyRewards` by policy. Returns the table (columns: scope,
    checkpoint, epoch, step, then evaluate's summary columns) and each estimator's per-step
    MSE curve (steps,) keyed by its label. ``plan`` is what every trajectory replay runs
    (:class:`~basis_bench.evaluation.replay_plan.ReplayPlan`), ``schedule`` this one's
    epochs. ``progress(checkpoint, epoch)`` after every epoch. ``prompts``: the prompts
    table, whose features (``plan.features``) go to the tilt table for the estimators that
    condition on the prompt.
    """
    plan, sched = plan or ReplayPlan(), schedule or EpochSchedule()
    start = ReplayStart.build(plan, rollouts, (reference, checkpoints), estimators, prompts)
    ests, p = start.estimators, len(start.ids)
    g_max = _check(plan, sched, ests, p, len(checkpoints))
    check_epoch_sizes(sched, plan.repeats, len(checkpoints), len(ests), p)
    splits = [
        _split(start.rewards[c].rows(start.ids), sched.oracle_n, c, g_max) for c in checkpoints
    ]
    rr = reward_range(start.cache, *(sp.pool for sp in splits))
    steppers = start.steppers(rr)
    b, n_epochs = sched.batch_size, len(checkpoints) * sched.epochs_per_checkpoint
    per_epoch = (p // b) * b
    names = [e.name for e in ests]
    totals = _Totals(
        {n: np.zeros((n_epochs, plan.repeats)) for n in names},
        {n: np.zeros(n_epochs) for n in names}, np.zeros(n_epochs), np.zeros(n_epochs),
        dict.fromkeys(names, np.zeros(0)), np.zeros(n_epochs),
    )  # fmt: skip
    sets = stream_sets(plan.repeats, p, [s.kernel for s in steppers])
    for k, (members, group) in enumerate(sets):
        last: dict[int, StepEstimator] = {}  # the last pass's streams, restarted for the next
        for lo in range(0, plan.repeats, group):
            streams = (lo, min(lo + group, plan.repeats))
            last = {
                i: start.stream(steppers[i], rr, (streams[1] - lo,), last.get(i)) for i in members
            }
            tracks = {
                steppers[i].estimator.name: _Track(
                    last[i], steppers[i].estimator.rollouts_per_prompt(plan.group_size)
                )
                for i in members
            }
            _replay_streams(
                (plan, sched), checkpoints, splits, tracks, streams, g_max, totals,
                progress, visits=k == 0,
            )  # fmt: skip
            for name, t in tracks.items():
                curve = np.asarray(t.curve)
                totals.curve[name] = curve if lo == 0 else totals.curve[name] + curve
    g = {e.name: e.rollouts_per_prompt(plan.group_size) for e in ests}
    table_rows = _rows((plan, sched), checkpoints, per_epoch, g, totals)
    curves = {n: totals.curve[n] / (plan.repeats * b * g[n]) for n in names}
    return pl.DataFrame(table_rows, schema_overrides={"epoch": pl.Int64}), curves


def _replay_streams(
    settings: tuple[ReplayPlan, EpochSchedule], checkpoints: Sequence[str],
    splits: Sequence[_Split], tracks: Mapping[str, _Track], streams: tuple[int, int],
    g_max: int, totals: _Totals, progress: Callable[[str, int], None] | None, visits: bool,
) -> None:  # fmt: skip
    """Repeats [lo, hi) over every checkpoint and epoch, added into ``totals``; what the
    visits alone give (oracle noise, V(1 - V), the next checkpoint's share) too if
    ``visits`` (one set of estimators counts them). Each draw reads its rows of the seeded
    stream (:class:`_Uniforms`), so a pass of some repeats draws what one pass of all would
    for them, whichever estimators it runs."""
    plan, s = settings
    rng = np.random.default_rng(plan.seed)
    p, b = len(splits[0].oracle), s.batch_size
    per_epoch = (p // b) * b
    e = 0
    for ck, (checkpoint, split) in enumerate(zip(checkpoints, splits, strict=True)):
        following = splits[ck + 1] if s.blend and ck + 1 < len(splits) else None
        for epoch in range(s.epochs_per_checkpoint):
            share = 0.0 if following is None else epoch / s.epochs_per_checkpoint
            keys = _Uniforms(rng, (plan.repeats, p)).block(0, p, streams)
            index = np.argsort(keys, axis=1)[:, :per_epoch]
            mixing = following if share > 0 else None
            draws = _EpochDraws(rng, index, g_max, split, mixing, share, (plan.repeats, streams))
            oracle, noise = split.oracle, split.noise
            if mixing is not None:
                # the mixture policy: each rollout is the next checkpoint's with probability share
                oracle = (1 - share) * oracle + share * mixing.oracle
                noise = (1 - share) ** 2 * noise + share**2 * mixing.noise
            if visits:
                totals.noise[e] += float(noise[index].sum())
                totals.spread[e] += float((oracle * (1 - oracle) + noise)[index].sum())
                totals.share[e] = share
            epoch_sq = _run_epoch(tracks, draws, oracle, b)
            for name, t in tracks.items():
                totals.sq[name][e, streams[0] : streams[1]] = epoch_sq[name]
                totals.extreme[name][e] += t.extreme_last
            e += 1
            if progress is not None:
                progress(checkpoint, epoch + 1)


def _rows(
    settings: tuple[ReplayPlan, EpochSchedule], checkpoints: Sequence[str], per_epoch: int,
    g: Mapping[str, int], totals: _Totals,
) -> list[dict[str, Any]]:  # fmt: skip
    """The table: a row per (checkpoint, epoch, estimator), then per (checkpoint, estimator)."""
    plan, s = settings
    rows: list[dict[str, Any]] = []
    step_count = e = 0
    for ck, checkpoint in enumerate(checkpoints):
        sq_ckpt = {name: np.zeros(plan.repeats) for name in g}
        extreme_ckpt = dict.fromkeys(g, 0.0)
        noise_ckpt = share_sum = spread_ckpt = 0.0
        for epoch in range(s.epochs_per_checkpoint):
            share, noise_sum = float(totals.share[e]), float(totals.noise[e])
            spread = float(totals.spread[e])
            share_sum += share
            noise_ckpt += noise_sum
            spread_ckpt += spread
            step_count += per_epoch // s.batch_size
            for name in g:
                sq_sum, extreme = totals.sq[name][e], float(totals.extreme[name][e])
                sq_ckpt[name] += sq_sum
                extreme_ckpt[name] += extreme
                rows.append(
                    {
                        "scope": "epoch", "checkpoint": checkpoint, "checkpoint_index": ck,
                        "epoch": ck * s.epochs_per_checkpoint + epoch + 1, "step": step_count,
                        "next_share": share, "estimator": name, "rollouts_per_prompt": g[name],
                        **summarise(sq_sum, per_epoch, noise_sum, extreme, spread,
                                    closed_form_scale(name, g[name])),
                    }
                )  # fmt: skip
            e += 1
        share_ckpt = share_sum / s.epochs_per_checkpoint
        for name in g:
            rows.append(
                {
                    "scope": "checkpoint", "checkpoint": checkpoint, "checkpoint_index": ck,
                    "epoch": None, "step": step_count, "next_share": share_ckpt,
                    "estimator": name, "rollouts_per_prompt": g[name],
                    **summarise(sq_ckpt[name], s.epochs_per_checkpoint * per_epoch, noise_ckpt,
                               extreme_ckpt[name], spread_ckpt, closed_form_scale(name, g[name])),
                }
            )  # fmt: skip
    return rows


class _Uniforms:
    """The uniforms of one ``rng.random((R, n, *rest))`` call, read a block of columns at a
    time. PCG64 spends one 64-bit draw per double, so row i's block [lo, hi) starts
    (i * n + lo) * prod(rest) draws into the call: the blocks are exactly the whole call's
    numbers while only (R, hi - lo, *rest) of them are ever held. Constructing it moves
    ``rng`` past the whole call, as drawing it would."""

    def __init__(self, rng: np.random.Generator, shape: tuple[int, ...]) -> None:
        self.state: Any = rng.bit_generator.state
        self.shape = shape
        self.inner = math.prod(shape[2:])
        rng.bit_generator.advance(math.prod(shape))  # type: ignore[attr-defined]

    def block(self, lo: int, hi: int, rows: tuple[int, int]) -> np.ndarray:
        """Columns [lo, hi) of rows [rows[0], rows[1])."""
        n, rest = self.shape[1], self.shape[2:]
        out = np.empty((rows[1] - rows[0], hi - lo, *rest))
        bits = np.random.PCG64()
        for j, i in enumerate(range(*rows)):
            bits.state = self.state
            bits.advance((i * n + lo) * self.inner)
            out[j] = np.random.Generator(bits).random((hi - lo, *rest))
        return out


class _EpochDraws:
    """One epoch's rewards (r, per_epoch, g_max) for the prompts ``index`` (r, per_epoch) of
    repeats [lo, hi) of R (``streams`` = (R, (lo, hi))), made a block of visits at a time: one
    pool draw per visit, or g_max without replacement; with a ``mixing`` checkpoint, each
    rollout is its draw with probability ``share``. The same numbers, in the same order, as
    drawing the whole epoch of all R repeats at once."""

    def __init__(
        self, rng: np.random.Generator, index: np.ndarray, g_max: int, split: _Split,
        mixing: _Split | None, share: float, streams: tuple[int, tuple[int, int]],
    ) -> None:  # fmt: skip
        self.index, self.g_max, self.split, self.mixing, self.share = (
            index, g_max, split, mixing, share
        )  # fmt: skip
        self.repeats, self.rows = streams
        self.own = _Uniforms(rng, self._key_shape(split))
        self.later = None if mixing is None else _Uniforms(rng, self._key_shape(mixing))
        self.mix = None if mixing is None else _Uniforms(rng, (*self._key_shape(None), g_max))

    def _key_shape(self, split: _Split | None) -> tuple[int, ...]:
        """The shape of one whole draw of all R repeats (width: the pool's, with g_max > 1)."""
        visits = (self.repeats, self.index.shape[1])
        return visits if self.g_max == 1 or split is None else (*visits, split.pool.shape[1])

    def block_size(self, b: int) -> int:
        """Visits per block, whole batches of ``b``: at most about BLOCK_DRAWS uniforms."""
        keys = math.prod(self._key_shape(self.split)[2:]) * self.index.shape[0]
        return max(1, BLOCK_DRAWS // max(keys * b, 1)) * b

    def rewards(self, lo: int, hi: int) -> np.ndarray:
        """The rewards (r, hi - lo, g_max) of visits [lo, hi)."""
        index = self.index[:, lo:hi]
        out = _pick(self.split, index, self.own.block(lo, hi, self.rows), self.g_max)
        if self.mixing is not None and self.later is not None and self.mix is not None:
            later = _pick(self.mixing, index, self.later.block(lo, hi, self.rows), self.g_max)
            out = np.where(self.mix.block(lo, hi, self.rows) < self.share, later, out)
        return out


def _pick(split: _Split, index: np.ndarray, keys: np.ndarray, g_max: int) -> np.ndarray:
    """Rewards (..., g_max) of the prompts ``index`` (...) from a checkpoint's pool, given the
    uniforms ``keys``: one draw per visit, or g_max without replacement."""
    pool, pool_count = split.pool, split.pool_count
    if g_max == 1:
        col = np.floor(keys * pool_count[index]).astype(np.int64)
        return pool[index, col][..., None]
    cols = pick_rollouts(keys, pool_count[index], g_max)
    return pool[index[..., None], cols]


def _block_baselines(t: _Track, index: np.ndarray, rewards: np.ndarray, b: int) -> list[np.ndarray]:
    """Each step's baselines (r, b, g) over a block of visits: index (r, k b), rewards
    (r, k b, g_max). An estimator that carries no state takes up to STATELESS_VISITS of them
    in one call, its steps as more streams (streams are independent rows: the numbers of one
    call a step, with one call's overhead, so the trajectory's time stays linear in the
    prompts however many passes of streams it takes); one that does steps through them in
    order."""
    r, n = index.shape
    if t.step.carries_state:
        return [
            np.asarray(
                t.step.step_columns(
                    index[:, lo : lo + b], rewards[:, lo : lo + b, : t.g]
                ).baselines,
                dtype=np.float64,
            )
            for lo in range(0, n, b)
        ]
    out: list[np.ndarray] = []
    width = max(1, STATELESS_VISITS // (r * b)) * b
    for lo in range(0, n, width):
        cols, rw = index[:, lo : lo + width], rewards[:, lo : lo + width, : t.g]
        k = cols.shape[1] // b
        t.step.reset(lead=(r * k,))
        res = t.step.step_columns(cols.reshape(-1, b), rw.reshape(-1, b, t.g))
        base = np.asarray(res.baselines, dtype=np.float64).reshape(r, k, b, -1)
        out += [np.ascontiguousarray(base[:, j]) for j in range(k)]
    return out


def _run_epoch(
    tracks: Mapping[str, _Track], draws: _EpochDraws, oracle: np.ndarray, b: int
) -> dict[str, np.ndarray]:
    """Every estimator over one epoch's batches, in order: each repeat's summed squared
    error (R,). The rewards are drawn a block of batches at a time; estimators carry no
    state between one another, so each runs its steps of a block before the next."""
    index = draws.index
    out = {name: np.zeros(index.shape[0]) for name in tracks}
    extreme = dict.fromkeys(tracks, 0)
    size = draws.block_size(b)
    for lo in range(0, index.shape[1], size):
        hi = min(lo + size, index.shape[1])
        rewards = draws.rewards(lo, hi)
        for name, t in tracks.items():
            steps = _block_baselines(t, index[:, lo:hi], rewards, b)
            for start, base in zip(range(lo, hi, b), steps, strict=True):
                err = (base - oracle[index[:, start : start + b], None]) ** 2
                t.curve.append(float(err.sum()))
                out[name] += err.mean(axis=-1).sum(axis=1)
                extreme[name] += int(((base == 0) | (base == 1)).sum())
    for name, t in tracks.items():
        t.extreme_last = extreme[name] if t.g == 1 else extreme[name] / t.g
    return out
