"""Trajectory replay on training's schedule: steps, a rollout budget, cross-fitted pools.

The epoch replay (:mod:`~basis_bench.evaluation.trajectory`) visits every prompt a fixed
number of times per checkpoint and draws from a 16-sample pool with replacement. This one
replays a checkpoint sequence the way the training run that made it went:

* **Steps.** Checkpoint c was saved at training step s_c (the dataset's training record).
  The replay runs steps t = s_0, ..., s_last (+ ``standing_steps`` more at the last
  checkpoint). Between checkpoints each prompt's value moves in log-odds,
  logit V_i(t) = (1 - w) logit V_i,c + w logit V_i,c+1 with w = (t - s_c) / (s_c+1 - s_c),
  so how far a prompt drifts between two visits follows from the training's own rate. The
  policy at step t is realised with real rollouts: each rollout of prompt i is checkpoint
  c+1's with probability m_i(t) = (V_i(t) - V_i,c) / (V_i,c+1 - V_i,c), else checkpoint c's,
  a mixture whose value is V_i(t) exactly; the oracle is the same mixture of the two oracles.
* **A rollout budget.** With ``rollouts_per_step`` R, an estimator that takes G rollouts per
  visit visits R / G prompts a step (the paper's protocol: 64 prompts x 8 or 512 x 1), so
  every estimator spends the same rollouts; without it, every estimator visits
  ``batch_size`` prompts a step (per visit; group estimators spend G times more). Each
  estimator group (same prompts per step) is its own training run: prompts come in epochs
  over the prompt set without replacement, B a step (a partial last batch dropped).
  A step of B > P visits (a one-rollout budget beyond the P prompts) is B // P passes over
  every prompt then, unless P divides B, a batch of B mod P prompts drawn in epochs as
  above: ceil(B / P) batches of distinct prompts at the same training step, replayed one
  after another, so a prompt is visited B / P times a step, as a one-rollout training run
  whose batch exceeds its prompt set visits it (each prompt once per copy in the batch).
  The policy is the same for all of them; the estimator's state is updated between them
  (a stateful estimator counts each batch as a step), so a later batch's baseline has seen
  an earlier batch's reward of the same policy: what the budget buys. Every estimator still
  spends B G rollouts a step: GRPO(8) at R = 64 visits 8 prompts, a one-rollout estimator
  all 48 of the dense trajectory once and 16 of them twice.
* **Cross-fitted pools, no floor.** Each checkpoint's samples of a prompt are split at random
  into ``folds`` folds; repeat r draws from fold r mod F (its pool) and is scored against
  the mean of the other folds (its oracle), so across repeats every sample serves both
  roles and the draws are never the oracle's. A prompt's pool is read in a random order of
  the repeat's own, without replacement; only once it is used up are samples reused (the
  share is reported as ``pool_reuse``). An estimator that averages a standing policy's
  rollouts therefore approaches the value, not the mean of a 16-sample pool.

The oracle's own noise, Var(oracle) = sigma^2 / n_oracle for one fold set, enters the
squared error additively because the oracle and the draws are disjoint samples; the
noise-corrected MSE subtracts (1 - m)^2 Var_c + m^2 Var_c+1, estimated per visit by the
oracle samples' variance (ddof = 1). Random numbers are counter-based
(:mod:`~basis_bench.evaluation.counter_random`): any subset of repeats draws what the
whole run would, so memory passes never change a result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from basis_bench.errors import InputError
from basis_bench.estimators import Estimator, StepEstimator
from basis_bench.evaluation.config import named
from basis_bench.evaluation.counter_random import permute, tag, uniforms
from basis_bench.evaluation.dataset import Rewards
from basis_bench.evaluation.gradient import (
    ORACLE_ARM,
    GradientProbe,
    Target,
    closed_form_scale,
    gradient_table,
    normalised_arms,
)
from basis_bench.evaluation.replay_plan import (
    ReplayPlan,
    ReplayStart,
    Stepper,
    reward_range,
    small_pages,
    stream_bytes,
    stream_group,
    stream_sets,
    summarise,
)
from basis_bench.guards.memory_check import Size, check_sizes

FOLD, ORDER, MIX, POOL = tag("fold"), tag("order"), tag("mix"), tag("pool")


@dataclass(frozen=True)
class StepSchedule:
    """The step schedule's settings: B prompts a step per visit (unless a budget), the
    rollouts every estimator spends a step (None: B prompts per visit), the cross-fit's
    folds, and the steps the last checkpoint stands after its own."""

    batch_size: int = 64
    rollouts_per_step: int | None = None
    folds: int = 2
    standing_steps: int = 0


class Folds(NamedTuple):
    """One checkpoint's cross-fit: for fold f as the pool, the oracle mean (F, P), its
    noise Var(oracle) (F, P), the pool's rewards in random order (F, P, W), NaN-padded,
    the pool sizes (F, P), the column of each pool reward in the checkpoint's rows
    (F, P, W; -1 padded) and the fold of every sample (P, S)."""

    oracle: np.ndarray
    noise: np.ndarray
    pool: np.ndarray
    pool_size: np.ndarray
    columns: np.ndarray
    member: np.ndarray


def cross_fit(rewards: np.ndarray, folds: int, seed: int, index: int, name: str) -> Folds:
    """Split each prompt's samples (a row of ``rewards``, NaN-padded) at random into
    ``folds`` folds of near-equal size; fold f's pool is fold f, its oracle the rest."""
    p, s = rewards.shape
    finite = np.isfinite(rewards)
    keys = uniforms(seed, FOLD, index, np.arange(p)[:, None], np.arange(s)[None, :])
    keys[~finite] = 2.0  # missing samples sort last
    perm = np.argsort(keys, axis=1)
    ranked = np.take_along_axis(rewards, perm, axis=1)
    fold_of = np.arange(s) % folds
    member = np.empty((p, s), dtype=np.int64)
    np.put_along_axis(member, perm, np.broadcast_to(fold_of, (p, s)), axis=1)
    oracle, noise, pools, counts, columns = [], [], [], [], []
    for f in range(folds):
        pool = ranked[:, fold_of == f]
        columns.append(perm[:, fold_of == f])
        rest = ranked[:, fold_of != f]
        n_rest = np.isfinite(rest).sum(axis=1)
        count = np.isfinite(pool).sum(axis=1)
        if n_rest.min() < 2 or count.min() < 1:
            raise InputError(
                f"checkpoint {name!r}: a prompt has {int(finite.sum(axis=1).min())} samples, too "
                f"few for {folds} folds (each fold's oracle needs 2, its pool 1); lower {named('folds')}"
            )
        oracle.append(np.nanmean(rest, axis=1))
        noise.append(np.nanvar(rest, axis=1, ddof=1) / n_rest)
        pools.append(pool)
        counts.append(count)
    width = max(p.shape[1] for p in pools)
    padded = np.full((folds, p, width), np.nan)
    at = np.full((folds, p, width), -1, dtype=np.int64)
    for f, pool in enumerate(pools):
        padded[f, :, : pool.shape[1]] = pool
        at[f, :, : pool.shape[1]] = columns[f]
    return Folds(np.stack(oracle), np.stack(noise), padded, np.stack(counts), at, member)


def mixture_weight(
    v_from: np.ndarray, v_to: np.ndarray, w: float, eps: float | np.ndarray
) -> np.ndarray:
    """m such that (1 - m) v_from + m v_to equals the log-odds path's value at w:
    sigmoid((1 - w) logit v_from + w logit v_to), the values clipped to [eps, 1 - eps]."""
    if w == 0.0:
        return np.zeros_like(v_from)
    a, b = np.clip(v_from, eps, 1 - eps), np.clip(v_to, eps, 1 - eps)
    logit = (1 - w) * np.log(a / (1 - a)) + w * np.log(b / (1 - b))
    target = 1 / (1 + np.exp(-logit))
    gap = v_to - v_from
    safe = np.abs(gap) > 1e-12
    m = np.where(safe, (target - v_from) / np.where(safe, gap, 1.0), w)
    return np.clip(m, 0.0, 1.0)


@dataclass(frozen=True)
class Timeline:
    """The training steps replayed: each step's checkpoint interval k and weight w."""

    steps: np.ndarray  # (T,) training step of each replayed step
    interval: np.ndarray  # (T,) index of the checkpoint at or before it
    weight: np.ndarray  # (T,) w: how far towards the next checkpoint

    @classmethod
    def build(cls, ckpt_steps: Sequence[int], standing: int) -> Timeline:
        s = np.asarray(ckpt_steps, dtype=np.int64)
        if s.size == 0 or np.any(np.diff(s) <= 0):
            raise InputError(
                f"the step schedule needs checkpoints at increasing training steps; got "
                f"{s.tolist()} (set them in the dataset's training.json)"
            )
        t = np.arange(s[0], s[-1] + 1 + standing)
        k = np.minimum(np.searchsorted(s, t, side="right") - 1, len(s) - 1)
        nxt = np.minimum(k + 1, len(s) - 1)
        span = np.where(nxt > k, s[nxt] - s[k], 1)
        w = np.where(nxt > k, (t - s[k]) / span, 0.0)
        if t.size < 2:
            raise InputError(
                "the step schedule replays a single step: give at least two checkpoints at "
                f"different steps, or {named('standing_steps')} to hold the last one"
            )
        return cls(t, k, w)


@dataclass
class _Run:
    """One estimator group: the estimators that visit the same prompts each step."""

    batch: int  # prompt visits per step (more than the prompts: several batches a step)
    prompts: int  # the prompts visited (P)
    draws: int  # rollouts drawn per visit (the group's largest G)
    members: list[tuple[Estimator, Any, Any, int]]  # (estimator, options, kernel, G)
    sq: dict[str, np.ndarray] = field(default_factory=dict)  # (T, R) summed squared error
    extreme: dict[str, np.ndarray] = field(default_factory=dict)  # (T,)
    noise: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (T,)
    spread: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (T,) V(1 - V) summed
    reuse: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (T,) reused draws
    # each member's streams of the last pass, restarted for the next (their memory kept)
    streams: dict[str, StepEstimator] = field(default_factory=dict)


def _runs(steppers: Sequence[Stepper], group_size: int, s: StepSchedule, p: int) -> list[_Run]:
    """Group the estimators by prompts per step (R / G with a budget, else B)."""
    runs: dict[int, _Run] = {}
    for stepper in steppers:
        e = stepper.estimator
        g = e.rollouts_per_prompt(group_size)
        b = s.rollouts_per_step // g if s.rollouts_per_step else s.batch_size
        if b < 1:
            raise InputError(
                f"{e.name} visits {b} prompt(s) a step ({s.rollouts_per_step} rollouts / G={g}); "
                f"raise {named('rollouts_per_step')} to {g} at least"
            )
        run = runs.setdefault(b, _Run(b, p, g, []))
        run.draws = max(run.draws, g)
        run.members.append((*stepper, g))
    return list(runs.values())


# What the step replay allocates for each size it is given (check_step_sizes), measured
# loosely from above: per replayed step, its timeline (t, k, next, span, w, masks) and its
# rows of the table (a dict of 20 values per estimator and scope, then polars); per batch of
# a step, the schedule's (key, columns) pair; per drawn rollout of a batch, the draw's
# arrays (rewards, masks, positions, uniforms, the order and the gathered pool values).
STEP_BYTES = 64
ROW_BYTES = 4096
BATCH_BYTES = 256
DRAW_BYTES = 160


def check_step_sizes(
    ckpt_steps: Sequence[int],
    plan: ReplayPlan,
    schedule: StepSchedule,
    estimators: Sequence[Estimator],
    prompts: int,
    steps_name: str = "the checkpoints' training steps",
    batch_from: tuple[str, int, float, str] | None = None,
) -> int:
    """The step replay's sizes against the memory budget before anything is allocated:
    the steps it replays (the checkpoints' span, from the dataset's training.json, and
    ``standing_steps``) and the prompts a step visits (``rollouts_per_step`` / G, or the
    batch). ``batch_from`` = (name, value, B per unit of it, advice) names where a batch that is not
    a setting came from (training.json's prompts_per_step). 10^9 standing steps grew to
    23.7 GB before; 10^9 rollouts a step ended in a MemoryError."""
    s = schedule
    first, last = (min(ckpt_steps), max(ckpt_steps)) if len(ckpt_steps) else (0, 0)
    groups = [e.rollouts_per_prompt(plan.group_size) for e in estimators] or [1]
    p = max(prompts, 1)
    per_step = STEP_BYTES + (ROW_BYTES + 8 * (plan.repeats + 4)) * len(estimators)
    together = stream_group(plan.repeats, stream_bytes(p, []) + 4 * p * s.folds)
    # a step's batches (B / P of them beyond P) are listed at once, each (key, columns);
    # they are drawn one at a time, so the draws of one batch, at most P prompts, are fixed
    per_visit = BATCH_BYTES / p
    draws = together * p * max(groups) * DRAW_BYTES
    if s.rollouts_per_step:  # B = R / G: the smallest G visits most
        batch = Size(named("rollouts_per_step"), s.rollouts_per_step, per_visit / min(groups))
    elif batch_from is not None:
        name, value, scale, advice = batch_from
        batch = Size(name, value, per_visit * scale, advice)
    else:
        batch = Size(named("batch_size"), s.batch_size, per_visit)
    # a fold: each repeat's count of pool samples taken and, per checkpoint, its oracle,
    # noise and pool size (the pools themselves are the checkpoint's samples, split)
    per_fold = 8 * together * p + 24 * p * max(len(ckpt_steps), 1)
    sizes = [
        Size(steps_name, max(last - first + 1, 0), per_step),
        Size(named("standing_steps"), s.standing_steps, per_step),
        batch,
        Size(named("folds"), s.folds, per_fold),
    ]
    return check_sizes("this step replay", sizes, base=draws)


@small_pages()
def replay_steps(
    rollouts: pl.DataFrame | Rewards,
    reference: str,
    checkpoints: Sequence[str],
    steps: Sequence[int],
    estimators: Sequence[str | Estimator],
    plan: ReplayPlan,
    schedule: StepSchedule,
    progress: Callable[[str, int], None] | None = None,
    prompts: pl.DataFrame | None = None,
    probe: GradientProbe | None = None,
) -> tuple[pl.DataFrame, dict[str, np.ndarray]]:
    """Replay ``estimators`` over ``checkpoints`` saved at training ``steps``; the table has
    one row per (step, estimator), per (checkpoint interval, estimator) and per estimator
    over the whole trajectory (scopes ``step``, ``checkpoint``, ``trajectory``); the curves
    are each estimator's MSE per replayed step. ``plan`` is what every trajectory replay
    runs (:class:`~basis_bench.evaluation.replay_plan.ReplayPlan`), ``schedule`` this one's
    steps. With a ``probe`` (the checkpoints' score sketches) every estimator's step
    gradients at the checkpoints' own steps are gathered too, and ``probe.table`` holds
    :func:`~basis_bench.evaluation.gradient.gradient_table`."""
    s = schedule
    start = ReplayStart.build(plan, rollouts, (reference, checkpoints), estimators, prompts)
    ids, p = start.ids, len(start.ids)
    if len(steps) != len(checkpoints):
        raise InputError(f"{len(checkpoints)} checkpoints but {len(steps)} steps")
    check_step_sizes(steps, plan, s, start.estimators, p)
    timeline = Timeline.build(steps, s.standing_steps)
    folds = [
        cross_fit(start.rewards[c].rows(ids), s.folds, plan.seed, k, c)
        for k, c in enumerate(checkpoints)
    ]
    rr = reward_range(start.cache, *(f.pool for f in folds))
    runs = _runs(start.steppers(rr), plan.group_size, s, p)
    _check_pools(runs, folds, checkpoints)
    n_t = len(timeline.steps)
    for run in runs:
        run.sq = {e.name: np.zeros((n_t, plan.repeats)) for e, *_ in run.members}
        run.extreme = {e.name: np.zeros(n_t) for e, *_ in run.members}
        run.noise, run.reuse, run.spread = np.zeros(n_t), np.zeros(n_t), np.zeros(n_t)
        kernels = [k for _, _, k, _ in run.members]
        sets = stream_sets(plan.repeats, p, kernels, 4 * p * len(folds))
        for n, (members, group) in enumerate(sets):
            part = [run.members[i] for i in members]
            for lo in range(0, plan.repeats, group):
                span = (lo, min(lo + group, plan.repeats))
                _replay_run(run, part, span, timeline, folds, (start, rr), (s.folds, n == 0), probe)
        if progress is not None:
            progress(f"{run.batch} prompts a step", n_t)
    if probe is not None:
        probe.table = _gradient(probe, folds, [start.rewards[c].rows(ids) for c in checkpoints],
                                timeline, checkpoints, plan, s.folds)  # fmt: skip
    return _table(runs, timeline, checkpoints, plan.repeats, s), _curves(runs, plan.repeats)


def _gradient(
    probe: GradientProbe, folds: Sequence[Folds], rewards: Sequence[np.ndarray],
    timeline: Timeline, checkpoints: Sequence[str], plan: ReplayPlan, n_folds: int,
) -> pl.DataFrame:  # fmt: skip
    """The gradient table: each checkpoint's target from the folds a repeat does not draw."""
    targets = []
    for f, r, sk in zip(folds, rewards, probe.sketches, strict=True):
        rest = np.stack([(f.member != k) & np.isfinite(r) for k in range(n_folds)])
        targets.append(Target.build(r, sk, rest))
    at = {
        u: int(k)
        for u, (k, w) in enumerate(zip(timeline.interval, timeline.weight, strict=True))
        if w == 0
    }
    return gradient_table(
        probe, targets, np.arange(plan.repeats) % n_folds, at, checkpoints, plan.group_size
    )


def _check_pools(runs: Sequence[_Run], folds: Sequence[Folds], names: Sequence[str]) -> None:
    """A visit draws its G rollouts without replacement: every pool needs G samples."""
    need = max(r.draws for r in runs)
    for f, name in zip(folds, names, strict=True):
        if f.pool_size.min() < need:
            raise InputError(
                f"checkpoint {name!r}: a prompt's pool holds {int(f.pool_size.min())} samples, fewer "
                f"than the {need} rollouts of one visit; lower {named('folds')} or {named('group_size')}"
            )


def _replay_run(
    run: _Run, members: Sequence[tuple[Estimator, Any, Any, int]], rows: tuple[int, int],
    timeline: Timeline, folds: Sequence[Folds],
    start: tuple[ReplayStart, tuple[float, float] | None], folding: tuple[int, bool],
    probe: GradientProbe | None = None,
) -> None:  # fmt: skip
    """Repeats [lo, hi) of some of one estimator group's ``members`` over every step, into
    the run's totals (and the probe's gradients at the steps whose policy is a checkpoint's
    own, w = 0); ``start`` the replay's start and the rewards' range; ``folding`` the pool's
    folds and whether these members count what the visits alone give (oracle noise, reuse,
    V(1 - V), the probe's oracle arm: one set of the group's members does)."""
    n_folds, visits = folding
    r_ids = np.arange(*rows)
    lead = (len(r_ids),)
    p = folds[0].oracle.shape[1]
    built, rr = start
    seed = built.plan.seed
    streams = {
        e.name: built.stream(
            Stepper(e, opts, kernel), rr or (0.0, 1.0), lead, run.streams.get(e.name)
        )
        for e, opts, kernel, _ in members
    }
    run.streams.update(streams)
    used = np.zeros((len(r_ids), p, len(folds)), dtype=np.int64)  # pool samples taken so far
    rho = r_ids % n_folds  # each repeat's pool fold
    schedule = VisitSchedule(run.batch, p, r_ids, seed)
    for u, (k, w) in enumerate(zip(timeline.interval, timeline.weight, strict=True)):
        nxt = min(int(k) + 1, len(folds) - 1)
        for key, cols in schedule.batches(u):  # cols (r, b): one batch of distinct prompts
            visit = _draw(run, folds, (int(k), nxt, float(w)), cols, rho, r_ids, used, seed, key)
            if visits:
                run.noise[u] += float(visit.noise.sum())
                run.spread[u] += float((visit.oracle * (1 - visit.oracle) + visit.noise).sum())
                run.reuse[u] += float(visit.reused.sum())
            gauge = probe if w == 0 else None  # the policy is checkpoint k's own
            drawn = gauge.gather(int(k), cols, visit.samples) if gauge is not None else None
            for e, _, _, g in members:
                out = streams[e.name].step_columns(cols, visit.rewards[..., :g])
                base = np.asarray(out.baselines, dtype=np.float64)
                err = (base - visit.oracle[..., None]) ** 2
                run.sq[e.name][u, rows[0] : rows[1]] += err.mean(axis=-1).sum(axis=1)
                extreme = int(((base == 0) | (base == 1)).sum())
                run.extreme[e.name][u] += extreme / g
                if gauge is not None and drawn is not None:
                    adv = visit.rewards[..., :g] - base
                    gauge.add(e.name, g, u, rows, drawn[..., :g, :], adv, run.batch)
                    for arm, a in normalised_arms(e.name, adv, visit.rewards[..., :g]):
                        gauge.add(arm, g, u, rows, drawn[..., :g, :], a, run.batch)
            if gauge is not None and drawn is not None and visits:
                for g in sorted({g for *_, g in run.members}):
                    adv = visit.rewards[..., :g] - visit.oracle[..., None]  # b = v: the limit
                    at = (u, rows, drawn[..., :g, :], adv, run.batch, visit.noise)
                    gauge.add(ORACLE_ARM, g, *at)


class VisitSchedule:
    """The prompts of one estimator group's steps, ``batch`` (B) visits a step of P prompts,
    for repeats ``r_ids``. B <= P: the next batch of an epoch (each repeat and epoch its own
    random order, P // B batches an epoch, the rest dropped). B > P: B // P passes over every
    prompt, then a batch of B mod P drawn in epochs as above (see the module's docstring)."""

    def __init__(self, batch: int, p: int, r_ids: np.ndarray, seed: int) -> None:
        self.batch, self.p, self.r_ids, self.seed = batch, p, r_ids, seed
        self.passes, self.part = divmod(batch, p) if batch > p else (0, batch)
        self._epoch: tuple[int, np.ndarray] = (-1, np.zeros(0, dtype=np.int64))

    def batches(self, u: int) -> list[tuple[tuple[int, ...], np.ndarray]]:
        """Step u's batches in replay order: (random-number key, columns (r, size)). A step
        of one batch keys its draws by u alone (what the replay drew before steps of
        several batches existed), one of several by (u, batch)."""
        every = np.broadcast_to(np.arange(self.p), (len(self.r_ids), self.p))
        out = [every] * self.passes
        if self.part:
            epoch, j = divmod(u, self.p // self.part)
            if epoch != self._epoch[0]:
                keys = uniforms(self.seed, ORDER, self.batch, self.r_ids[:, None], epoch,
                                np.arange(self.p))  # fmt: skip
                self._epoch = (epoch, np.argsort(keys, axis=1))
            out.append(self._epoch[1][:, j * self.part : (j + 1) * self.part])
        if len(out) == 1:
            return [((u,), out[0])]
        return [((u, i), cols) for i, cols in enumerate(out)]


class _Visit(NamedTuple):
    rewards: np.ndarray  # (r, b, draws)
    oracle: np.ndarray  # (r, b)
    noise: np.ndarray  # (r, b)
    reused: np.ndarray  # (r, b, draws) bool
    samples: np.ndarray  # (r, b, draws) the drawn samples' columns in their checkpoint's rows


def _draw(
    run: _Run, folds: Sequence[Folds], at: tuple[int, int, float], cols: np.ndarray,
    rho: np.ndarray, r_ids: np.ndarray, used: np.ndarray, seed: int, key: tuple[int, ...],
) -> _Visit:  # fmt: skip
    """One batch's rollouts of the visited prompts from the mixture policy between
    checkpoints ``at`` = (k, next, w) at weight w, each from its checkpoint's pool without
    replacement (``used`` counts what was taken); ``key`` numbers the batch's draws."""
    k, nxt, w = at
    rf = rho[:, None]
    here, there = folds[k], folds[nxt]
    v_here, v_there = here.oracle[rf, cols], there.oracle[rf, cols]
    eps = 0.5 / here.pool_size.sum(axis=0)[cols]  # half a sample of the prompt's
    m = mixture_weight(v_here, v_there, w, eps) if nxt != k else np.zeros_like(v_here)
    oracle = (1 - m) * v_here + m * v_there
    noise = (1 - m) ** 2 * here.noise[rf, cols] + m**2 * there.noise[rf, cols]
    slots = np.arange(run.draws)
    rows = np.arange(len(r_ids))[:, None]
    later = (
        uniforms(seed, MIX, run.batch, r_ids[:, None, None], *key, cols[..., None], slots)
        < m[..., None]
    )
    rewards = np.full((*cols.shape, run.draws), np.nan)
    samples = np.full(rewards.shape, -1, dtype=np.int64)
    reused = np.zeros(rewards.shape, dtype=bool)
    for c, take in ((k, ~later), (nxt, later)) if nxt != k else ((k, np.ones_like(later)),):
        f = folds[c]
        count = f.pool_size[rf, cols][..., None]  # (r, b, 1)
        pos = used[rows, cols, c][..., None] + np.cumsum(take, axis=-1) - 1
        reused |= take & (pos >= count)
        order = permute(
            pos % count, count, seed, POOL, run.batch, r_ids[:, None, None], c, cols[..., None]
        )
        got = f.pool[rf[..., None], cols[..., None], order]
        rewards = np.where(take, got, rewards)
        samples = np.where(take, f.columns[rf[..., None], cols[..., None], order], samples)
        used[rows, cols, c] += take.sum(axis=-1)
    return _Visit(rewards, oracle, noise, reused, samples)


def schedule_label(s: StepSchedule) -> str:
    """How the replay spent its rollouts, for every table row."""
    if s.rollouts_per_step:
        return f"steps, budget {s.rollouts_per_step} rollouts a step"
    return f"steps, {s.batch_size} prompts a step (per visit)"


def _scopes(timeline: Timeline, n_checkpoints: int) -> list[tuple[str, int, int]]:
    """(scope, first, end) step ranges: each step, each checkpoint's interval, the whole."""
    scopes = [("step", u, u + 1) for u in range(len(timeline.steps))]
    for k in range(n_checkpoints):
        at = np.flatnonzero(timeline.interval == k)
        if at.size:
            scopes.append(("checkpoint", int(at[0]), int(at[-1]) + 1))
    return [*scopes, ("trajectory", 0, len(timeline.steps))]


def _table(
    runs: Sequence[_Run],
    timeline: Timeline,
    checkpoints: Sequence[str],
    repeats: int,
    s: StepSchedule,
) -> pl.DataFrame:
    """Rows per (step, estimator), per (checkpoint interval, estimator), per estimator."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        for e, _, _, g in run.members:
            for scope, lo, hi in _scopes(timeline, len(checkpoints)):
                k = int(timeline.interval[lo if scope == "checkpoint" else hi - 1])
                visits = (hi - lo) * run.batch
                rows.append({
                    "scope": scope, "schedule": schedule_label(s), "checkpoint": checkpoints[k],
                    "checkpoint_index": k, "step": int(timeline.steps[hi - 1]),
                    "next_share": float(timeline.weight[lo:hi].mean()), "estimator": e.name,
                    "rollouts_per_prompt": g, "prompts_per_step": run.batch,
                    "visits_per_prompt": visits / run.prompts, "rollouts_spent": run.batch * g * hi,
                    **summarise(run.sq[e.name][lo:hi].sum(axis=0), visits,
                                float(run.noise[lo:hi].sum()),
                                float(run.extreme[e.name][lo:hi].sum()),
                                float(run.spread[lo:hi].sum()), closed_form_scale(e.name, g)),
                    "pool_reuse": float(run.reuse[lo:hi].sum()) / (repeats * visits * run.draws),
                })  # fmt: skip
    return pl.DataFrame(rows)


def _curves(runs: Sequence[_Run], repeats: int) -> dict[str, np.ndarray]:
    """Each estimator's MSE per replayed step."""
    return {
        e.name: run.sq[e.name].sum(axis=1) / (repeats * run.batch)
        for run in runs
        for e, *_ in run.members
    }
