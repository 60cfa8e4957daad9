"""What both trajectory replays share: the plan, what it builds once, and the summary.

A trajectory replay runs every estimator over the checkpoints in training order, on one of
two schedules, each its own module with its own settings: the epoch schedule
(:mod:`~basis_bench.evaluation.trajectory`, :class:`EpochSchedule`) and the step schedule
(:mod:`~basis_bench.evaluation.step_replay`, :class:`StepSchedule`). Both start the same
way, here: the prompts every policy shares, the reference cache (each prompt's first
``ref_n`` reference samples), its tilt table (with the prompts' features for the
estimators that condition on them) and each estimator's options and step kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from basis_bench.errors import InputError
from basis_bench.estimators import Estimator, StepEstimator, TiltTable, default_betas, get
from basis_bench.estimators.kernel import StepKernel
from basis_bench.estimators.options import DEFAULT_PRIOR
from basis_bench.estimators.refine import Z_95
from basis_bench.evaluation.dataset import Rewards, rewards_from_frame
from basis_bench.rollouts.features import prompt_features

SHUFFLE_BYTES = 16  # per stream and prompt: an epoch's sort keys and their order
STREAM_BYTES = 64 * 2**20  # streams run together in one pass up to this much state
SPLIT_PASSES = 4  # estimators run in separate sets of passes past this many times the passes


@dataclass(frozen=True)
class ReplayPlan:
    """What a trajectory replay runs, whichever its schedule: R repeats (parallel streams),
    G for the group estimators, the cache's samples per prompt (n), the seed, the tilt
    table's grid (None: the default) and prior, each estimator's options by name (object or
    mapping) and the prompt features' kind (rollouts/features.py)."""

    repeats: int = 100
    group_size: int = 8
    ref_n: int = 64
    seed: int = 0
    grid_size: int | None = None
    prior: float = DEFAULT_PRIOR
    options: Mapping[str, Any] = field(default_factory=dict)
    features: str = "auto"


class Stepper(NamedTuple):
    """One estimator of a replay with its options and step kernel."""

    estimator: Estimator
    options: Any
    kernel: StepKernel


@dataclass(frozen=True)
class ReplayStart:
    """What a replay builds once from its plan: the rewards by policy, the prompts every
    policy shares (sorted), the estimators, the reference cache (P, n) and its table."""

    plan: ReplayPlan
    rewards: Rewards
    ids: np.ndarray
    estimators: list[Estimator]
    cache: np.ndarray
    table: TiltTable

    @classmethod
    def build(
        cls,
        plan: ReplayPlan,
        rollouts: pl.DataFrame | Rewards,
        policies: tuple[str, Sequence[str]],
        estimators: Sequence[str | Estimator],
        prompts: pl.DataFrame | None = None,
    ) -> ReplayStart:
        """From ``rollouts`` (a frame in the store's schema or rewards by policy) of
        ``policies`` = (reference, checkpoints); ``prompts``: the prompts table, whose
        features go to the table (None: no features)."""
        reference, checkpoints = policies
        ests = [get(e) if isinstance(e, str) else e for e in estimators]
        rewards = rewards_from_frame(rollouts) if isinstance(rollouts, pl.DataFrame) else rollouts
        ids, _ = shared_prompts(rewards, reference, checkpoints)
        cache = rewards[reference].rows(ids)[:, : plan.ref_n].copy()  # not a view of every column
        betas = default_betas(plan.grid_size) if plan.grid_size is not None else None
        features = prompt_features(prompts, list(ids), plan.features)
        table = TiltTable.from_cache(cache, betas, plan.prior, list(ids), features)
        return cls(plan, rewards, ids, ests, cache, table)

    def steppers(self, rr: tuple[float, float] | None) -> list[Stepper]:
        """Each estimator's options and step kernel, for rewards in ``rr`` (None: unbounded)."""
        out = []
        for e in self.estimators:
            opts = e.parse_options(self.plan.options.get(e.name))
            table = self.table if e.uses_cache else None
            out.append(Stepper(e, opts, e.kernel(e, opts, table, self.cache, rr)))
        return out

    def stream(
        self, s: Stepper, rr: tuple[float, float] | None, lead: tuple[int, ...],
        reuse: StepEstimator | None = None,
    ) -> StepEstimator:  # fmt: skip
        """``lead`` parallel streams of one estimator, from their initial state: ``reuse``
        (the last pass's streams of the same estimator) restarted, which keeps its state's
        memory where it can (:meth:`StepEstimator.reset`), or new ones."""
        if reuse is not None:
            reuse.reset(lead)
            return reuse
        return StepEstimator(s.estimator, s.options, s.kernel, self.table, rr, lead)


def shared_prompts(
    rollouts: pl.DataFrame | Rewards, reference: str, checkpoints: Sequence[str]
) -> tuple[np.ndarray, int]:
    """Sorted prompt ids present in the reference and every checkpoint, and how many are dropped."""
    rewards = rewards_from_frame(rollouts) if isinstance(rollouts, pl.DataFrame) else rollouts
    policies = set(rewards)
    missing = [p for p in (reference, *checkpoints) if p not in policies]
    if missing:
        raise InputError(
            f"policy {missing[0]!r} has no rollouts; present: {', '.join(sorted(policies))}"
        )
    if len(set(checkpoints)) != len(checkpoints) or not checkpoints:
        raise InputError("checkpoints must be a non-empty sequence of distinct policies, in order")
    sets = [set(rewards[p].prompt_ids.tolist()) for p in (reference, *checkpoints)]
    common = set.intersection(*sets)
    everywhere = set.union(*sets)
    if not common:
        raise InputError("no prompt has rollouts from the reference and every checkpoint")
    return np.array(sorted(common), dtype=object), len(everywhere) - len(common)


def reward_range(*arrays: np.ndarray) -> tuple[float, float] | None:
    """(0, 1) when every finite reward lies in it (the bounds the estimators assume), else None."""
    vals = np.concatenate([a[np.isfinite(a)] for a in arrays])
    return (0.0, 1.0) if vals.size == 0 or (vals.min() >= 0 and vals.max() <= 1) else None


def stream_group(repeats: int, stream_bytes: int) -> int:
    """Streams run together in one pass: as many as STREAM_BYTES hold, ``stream_bytes`` each."""
    return max(1, min(repeats, STREAM_BYTES // max(stream_bytes, 1)))


def stream_sets(
    repeats: int, prompts: int, kernels: Sequence[StepKernel], extra: int = 0
) -> list[tuple[list[int], int]]:
    """The kernels (by position) whose streams run together, each set with its streams per
    pass (``extra``: a stream's bytes besides its shuffle and the states). In order of state
    size, a kernel joins the set before it unless that would take the set's passes past
    SPLIT_PASSES times as many, else starts a set. One set for all runs every estimator in
    the passes the largest state needs (``basis_track``'s 8 KiB a prompt: each of them in
    200 passes of one stream at 17,398 prompts, every pass paying each step's calls again);
    each set draws every epoch's rollouts again (with G = 8 about 1 CPU-s per 1,000 prompts
    and 200 streams), so not a set each."""
    shuffle = SHUFFLE_BYTES * prompts + extra
    state = [stream_bytes(prompts, [k]) - SHUFFLE_BYTES * prompts for k in kernels]

    def group(members: list[int]) -> int:
        return stream_group(repeats, shuffle + sum(state[i] for i in members))

    def passes(members: list[int]) -> int:
        return -(-repeats // group(members))

    sets: list[list[int]] = []
    for i in sorted(range(len(kernels)), key=state.__getitem__):
        if sets and passes([*sets[-1], i]) <= SPLIT_PASSES * passes(sets[-1]):
            sets[-1].append(i)
        else:
            sets.append([i])
    return [(members, group(members)) for members in sets]


@contextmanager
def small_pages() -> Iterator[None]:
    """numpy's advice of huge pages for its large arrays off while the replay allocates, as
    it was after. Where the kernel's transparent huge pages are "madvise" (Ubuntu's default),
    the advice makes each first touch of a new array wait for the kernel to compact memory
    into 2 MiB pages: 16 of the 21 system CPU-seconds of `evaluate` at the paper's shape
    (17,398 prompts), 0.5 of a 2,000-prompt basis_track replay's 11 CPU-seconds
    (docs/scale.md). The replay reads its state a 4 KiB row at a time: huge pages would
    save it nothing to speak of (and this machine's kernel granted none)."""
    core = getattr(np, "_core", None) or getattr(np, "core", None)
    advise: Callable[[bool], bool] | None = getattr(
        getattr(core, "multiarray", None), "_set_madvise_hugepage", None
    )
    before = advise(False) if advise is not None else None
    try:
        yield
    finally:
        if advise is not None and before is not None:
            advise(before)


def stream_bytes(prompts: int, kernels: Sequence[StepKernel]) -> int:
    """One stream's memory: its epoch's shuffle and every estimator's state (what
    ``initial_state`` allocates for one stream: basis_memory's and basis_context's
    discounted histories, 64 bytes a prompt each, the SPO tracker's 16, ...), read off the
    shapes of a state for no streams: one for a stream would cost the system its pages."""
    state = sum(
        math.prod(a.shape[1:]) * a.itemsize for k in kernels for a in k.initial_state((0,)).values()
    )
    return SHUFFLE_BYTES * prompts + state


def summarise(
    sq_sum: np.ndarray, per_repeat: int, noise_sum: float, extreme: float,
    spread_sum: float, scale: float,
) -> dict[str, float | int]:  # fmt: skip
    """MSE, noise-corrected MSE, normal 95% CI over repeats, 0/1 share, count, and the
    per-rollout advantage noise (:func:`advantage_noise`)."""
    repeats = sq_sum.shape[0]
    mse_r = sq_sum / per_repeat
    n = repeats * per_repeat
    mse = float(mse_r.mean())
    half = Z_95 * float(mse_r.std(ddof=1)) / math.sqrt(repeats) if repeats > 1 else math.nan
    return {
        "mse": mse,
        "mse_noise_corrected": mse - noise_sum / n,
        "ci_low": mse - half,
        "ci_high": mse + half,
        "extreme_rate": extreme / n,
        "n_estimates": n,
        **advantage_noise(mse - noise_sum / n, spread_sum / n, scale),
    }


def advantage_noise(mse_corrected: float, spread: float, scale: float) -> dict[str, float]:
    """Per rollout, what the baseline adds to the advantage's noise: ``adv_noise_excess`` =
    E[(A' - (r - v))^2] = scale^2 E[(b' - v)^2] for the advantage A' = scale (r - b) on RLOO's
    scale (GRPO: scale G / (G - 1), which makes its baseline the leave-one-out mean, whose
    error is G / (G - 1) times GRPO's own MSE), and ``adv_noise_ratio`` = E[A'^2] / V(1 - V)
    = 1 + excess / V(1 - V), the noise a rollout feeds the gradient against the oracle
    baseline's (a baseline independent of the rollout's own reward; binary rewards)."""
    excess = mse_corrected * scale
    return {
        "adv_noise_excess": excess,
        "adv_noise_ratio": 1 + excess / spread if spread > 0 else math.nan,
    }
