"""``basis_memory``: one rollout per prompt and step, BASIS's calibrated tilt as the prior,
and the prompt's own discounted history of single rollouts as the evidence.

Per prompt i, a Beta posterior (docs/method.md, "A one-rollout estimator with memory"):

    prior      Beta(m V^_{i,beta}, m (1 - V^_{i,beta}))       V^ from the reference cache
    evidence   S_i = sum_a gamma^a r_{i,(a)},  N_i = sum_a gamma^a   over earlier visits,
               a = 0 for the latest earlier visit, 1 for the one before, ...
    posterior  p_i = (m V^_{i,beta} + S_i) / (m + N_i)
    baseline   b_i = sigmoid(logit p_i + delta)        delta: the history's lag (0: none)

S_i and N_i hold only visits BEFORE this step: the current reward never enters its own
baseline. The history is older policies' rewards; when the batch drifts as a whole (training
raises most prompts' success), delta moves the posterior's log-odds as BASIS's tilt moves the
reference's. theta = (beta, gamma, m, delta) is chosen from a grid (C candidates) by the loss of these
leave-current-out predictions, accumulated over steps: with L_t(theta) = sum_j loss(r_j,
b_j(theta)) the loss of step t's batch,

    A_t(theta) = sum_{s < t} lambda^(t - s) L_s(theta)        (lambda = ``loss_memory``)

and, by default (``selection="loo"``), prompt i's theta minimises A_t(theta) + L_{-i,t}(theta),
L_{-i,t} = sum_{j != i} loss(r_j, b_j(theta)) over the OTHER prompts of this batch. One
batch alone (lambda = 0) is ~B binary rewards against C = 4752 candidates: its choice is
noise; the accumulated past steps make it stable. A_t holds earlier steps' rewards only
(prompt i's earlier rewards among them: history), so b_i is a function of the cache, the
history and the other prompts' current rewards, never of r_i, and the advantage r_i - b_i
is unbiased given the history. With m > 0 and V^ strictly inside (0, 1) (the cache's
smoothing guarantees it for binary rewards) b_i is strictly inside (0, 1): never a 0/1
baseline, whatever the history.

State, numpy float64: S and N for every gamma of the grid, each (*lead, n_gammas, P), and
the accumulated losses A (*lead, C). After a step: S <- gamma S + r, N <- gamma N + 1 on the
batch's prompts, A <- lambda (A + L_t). A prompt twice in one batch (a training batch that
straddles two epochs) adds both rewards and both visits: S <- gamma S + r_1 + r_2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np

from basis_bench.errors import InputError
from basis_bench.estimators._array import (
    Array,
    RewardRange,
    asarray_like,
    check_rewards,
    same_prompt,
    to_numpy,
)
from basis_bench.estimators.options import LOSSES, checked_options, number_list
from basis_bench.estimators.output import StepOutput
from basis_bench.estimators.registry import register_estimator
from basis_bench.estimators.table import TiltTable
from basis_bench.settings import setting

MEMORY_GAMMAS = (0.5, 0.75, 0.9, 1.0)
MEMORY_WEIGHTS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 128.0)
MEMORY_SHIFTS = (-1.0, 0.0, 1.0, 2.0)
SELECTIONS = ("loo", "batch")
LOSS_MEMORY = 0.9
_LOG_CLIP = 1e-6
_CHUNK_ELEMENTS = 1 << 18


@dataclass(frozen=True)
class MemoryOptions:
    """Options of ``basis_memory``: the grids its calibration chooses from, and how far back
    the calibration's losses reach."""

    estimator: ClassVar[str] = "basis_memory"  # the name its errors give
    gammas: tuple[float, ...] = setting(
        MEMORY_GAMMAS,
        help="Candidate discounts per visit of the prompt's history, each in (0, 1].",
    )
    weights: tuple[float, ...] = setting(
        MEMORY_WEIGHTS,
        help="Candidate prior weights m (pseudo-counts of the tilted value), each > 0.",
    )
    shifts: tuple[float, ...] = setting(
        MEMORY_SHIFTS,
        help="Candidate logit shifts delta of the posterior mean p (the history's lag): the "
        "baseline is sigmoid(logit p + delta); 0 leaves p as it is.",
    )
    selection: str = setting(
        "loo",
        choices=SELECTIONS,
        help="loo: prompt i's (beta, gamma, m) from the other prompts' losses (unbiased); "
        "batch: one choice on the whole batch (its own reward takes part).",
    )
    loss: str = setting("squared", choices=LOSSES, help="Calibration loss: squared or log.")
    loss_memory: float = setting(
        LOSS_MEMORY,
        min_val=0,
        max_val=1,
        help="lambda in [0, 1]: each earlier step's calibration loss enters the choice with "
        "weight lambda^age (age in steps); 0: the current batch alone, 1: all steps alike.",
    )

    def __post_init__(self) -> None:
        """Every setting (a subclass's too) against its range and choices; the grids
        element by element."""
        c = self.estimator
        checked_options(self, c)
        numbers = "a list of numbers"
        grids = {
            "gammas": number_list(
                self.gammas,
                f"{c}.gammas",
                numbers,
                min_val=0,
                max_val=1,
                include_boundaries="right",
            ),
            "weights": number_list(
                self.weights, f"{c}.weights", numbers, min_val=0, include_boundaries="right"
            ),
            "shifts": number_list(self.shifts, f"{c}.shifts", numbers),
        }
        for name, grid in grids.items():
            object.__setattr__(self, name, grid)  # a frozen dataclass


def shift_logit(p: np.ndarray, shift: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """sigmoid(logit p + shift) = 1 / (1 + e^-shift (1 - p) / p): exact at p = 0 or 1, and p
    itself, bit for bit, where shift = 0. out: where to write it (None: a new array)."""
    out = np.subtract(1.0, p, out=out)
    out *= np.exp(-shift)
    with np.errstate(divide="ignore"):
        out /= p
    out += 1.0
    np.reciprocal(out, out=out)
    unshifted = shift == 0.0
    if unshifted.any():  # a pass over out only where some prompt's shift is 0
        np.copyto(out, p, where=unshifted)
    return out


def _log_losses(pred: np.ndarray, r: np.ndarray, out: np.ndarray) -> None:
    """Each prediction's log loss, written into out (numpy's log: the compiled loops take
    no transcendental function)."""
    p = np.clip(pred, _LOG_CLIP, 1 - _LOG_CLIP)
    np.negative(r * np.log(p) + (1 - r) * np.log1p(-p), out=out)


def memory_values(
    v: np.ndarray,
    s: np.ndarray,
    n: np.ndarray,
    rewards: np.ndarray,
    options: MemoryOptions,
    past: np.ndarray | None = None,
    prompt_shift: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Baselines (*lead, B), each prompt's chosen flat grid index (*lead, B), and this
    batch's loss per candidate (*lead, C).

    v: (K, *lead, B) tilted values of the batch; s, n: (*lead, Gm, B) the history before
    this step; rewards: (*lead, B); past: (*lead, C) the discounted losses of earlier steps
    (None: none). The flat index runs over C = (K, Gm, M, D) in C order; with
    ``prompt_shift`` = (judged, served), each (*lead, B), over C = (2, K, Gm, M, D): every
    candidate, then every candidate with prompt j's log-odds moved by judged_j, the shift
    its loss is computed with; a prompt i that chooses a moved candidate gets it moved by
    served_i (basis_context: judged from the history alone, served leave-one-out with the
    batch, so that r_i enters neither prompt i's choice nor its value). The streams (lead)
    go through in chunks of about ``_CHUNK_ELEMENTS`` candidate predictions, written into a
    buffer that every chunk reuses (and one of their losses for the log loss, whose
    logarithms numpy takes), by the compiled loops of
    :mod:`basis_bench.estimators.memory_loops`: the numpy arithmetic's numbers, bit for bit.
    """
    from basis_bench.estimators import memory_loops  # numba, imported on first use

    lead, b = rewards.shape[:-1], rewards.shape[-1]
    if options.selection == "loo" and b < 2:
        raise InputError("basis_memory's leave-one-out calibration needs B >= 2 prompts")
    weights = np.asarray(options.weights, dtype=np.float64)
    shifts = np.asarray(options.shifts, dtype=np.float64)
    # no shift at all: b itself, bit for bit (no factors)
    factors = tuple(np.exp(-shifts)) if shifts.shape != (1,) or shifts[0] != 0.0 else ()
    grid = (len(v), s.shape[-2], len(weights), len(shifts))
    variants = 1 if prompt_shift is None else 2
    n_cand = variants * math.prod(grid)
    streams = math.prod(lead)
    v, s, n = v.reshape(len(v), streams, b), s.reshape(streams, -1, b), n.reshape(streams, -1, b)
    r = np.ascontiguousarray(rewards.reshape(streams, b), dtype=np.float64)
    moved, unmoved, served = np.empty((0, b)), np.empty((0, b), dtype=bool), None
    if prompt_shift is not None:
        judged, served = (x.reshape(streams, b) for x in prompt_shift)
        moved, unmoved = np.exp(-judged), judged == 0.0
    prior = np.empty((0, n_cand)) if past is None else past.reshape(streams, n_cand)
    values, choice = np.empty((streams, b)), np.empty((streams, b), dtype=np.intp)
    total = np.empty((streams, n_cand))
    step = max(1, min(streams, _CHUNK_ELEMENTS // (b * n_cand)))
    predictions = np.empty((step, b, n_cand))  # reused by every chunk
    squared = options.loss == "squared"
    losses = np.empty((0, b, n_cand) if squared else (step, b, n_cand))  # log: numpy's log
    worst = np.ones(step)  # a bound on the losses: squared, (r - p)^2 <= 1 in [0, 1]
    for a in range(0, streams, step):
        z, c = slice(a, a + step), min(step, streams - a)
        pred, loss = predictions[:c], losses[:c]
        memory_loops.memory_predictions(
            v[:, z], s[z], n[z], weights, factors, moved[z], unmoved[z], r[z], squared,
            pred, total[z],
        )  # fmt: skip
        if not squared:
            _log_losses(pred, r[z, :, None], out=loss)
            loss.sum(axis=1, out=total[z])
            loss.max(axis=(1, 2), out=worst[:c])
        memory_loops.memory_choice(
            pred, loss, r[z], prior[z], options.selection == "loo", total[z], worst[:c],
            choice[z], values[z],
        )  # fmt: skip
        if served is not None:  # a moved choice: its unmoved value, moved by the served shift
            half = n_cand // 2
            unmoved_value = np.take_along_axis(pred, choice[z, :, None] % half, axis=-1)[..., 0]
            moved_value = shift_logit(unmoved_value, served[z])
            values[z] = np.where(choice[z] >= half, moved_value, values[z])
    return values.reshape(rewards.shape), choice.reshape(rewards.shape), total.reshape(*lead, -1)


class History(NamedTuple):
    """A batch's tilted values v (K, *lead, B) and its history s, n (*lead, Gm, B)."""

    v: np.ndarray
    s: np.ndarray
    n: np.ndarray


def _gather(state: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """state (*lead, Gm, P), cols (*lead, B) -> (*lead, Gm, B)."""
    idx = np.broadcast_to(cols[..., None, :], (*state.shape[:-1], cols.shape[-1]))
    return np.take_along_axis(state, idx, axis=-1)


def _scatter(state: np.ndarray, cols: np.ndarray, values: np.ndarray) -> None:
    idx = np.broadcast_to(cols[..., None, :], values.shape)
    np.put_along_axis(state, idx, values, axis=-1)


class MemoryKernel:
    """``basis_memory`` on the step interface (:mod:`basis_bench.estimators.step`)."""

    def __init__(
        self,
        estimator: Any,
        options: MemoryOptions,
        table: TiltTable | None,
        ref_rewards: np.ndarray | None,
        reward_range: RewardRange,
    ) -> None:
        if table is None:
            raise InputError("basis_memory needs the reference cache's tilt table")
        self.options, self.table = options, table
        self.gammas = np.asarray(options.gammas, dtype=np.float64)
        self.reward_range = reward_range
        self.n_prompts = table.values.shape[1]
        self.grid = (len(table.betas), len(self.gammas), len(options.weights), len(options.shifts))
        self.shape = (self.variants, *self.grid)
        self.n_candidates = math.prod(self.shape)

    def initial_state(self, lead: tuple[int, ...]) -> dict[str, np.ndarray]:
        shape = (*lead, len(self.gammas), self.n_prompts)
        return {
            "successes": np.zeros(shape),
            "visits": np.zeros(shape),
            "losses": np.zeros((*lead, self.n_candidates)),
        }

    variants = 1  # the grid once; basis_context adds a copy moved by a per-prompt shift

    def fit_shift(
        self, state: dict[str, np.ndarray], cols: np.ndarray, r: np.ndarray, history: History
    ) -> Any:
        """The per-prompt shift of the grid's second copy, and what ``learn`` needs (None)."""
        return None

    def shift_of(self, fit: Any) -> tuple[np.ndarray, np.ndarray] | None:
        """The (judged, served) shifts inside ``fit_shift``'s result (None: no second copy)."""
        return None

    def learn(self, state: dict[str, np.ndarray], fit: Any) -> None:
        """Update what the shift is fitted from, after the baselines are made (nothing here)."""

    def step(self, state: dict[str, np.ndarray], cols: np.ndarray, rewards: Array) -> StepOutput:
        check_rewards(rewards, self.reward_range)
        r = to_numpy(rewards[..., 0], dtype=np.float64)
        if np.any((r < 0) | (r > 1)):
            raise InputError("basis_memory's Beta posterior needs rewards in [0, 1]")
        s, n = _gather(state["successes"], cols), _gather(state["visits"], cols)
        v, _ = self.table.gather(cols)  # (K, *lead, B)
        fit = self.fit_shift(state, cols, r, History(v, s, n))
        values, choice, total = memory_values(
            v, s, n, r, self.options, state["losses"], self.shift_of(fit)
        )
        self.learn(state, fit)
        state["losses"] += total  # a step's losses weigh lambda^age, age 0 = the current step
        state["losses"] *= self.options.loss_memory
        g = self.gammas[:, None]
        copies = same_prompt(cols)
        visits = 1.0 if copies is None else copies.sum(-1)[..., None, :]
        wins = r if copies is None else np.einsum("...ij,...j->...i", copies, r)
        _scatter(state["successes"], cols, g * s + wins[..., None, :])
        _scatter(state["visits"], cols, g * n + visits)
        moved, k, gi, mi, di = np.unravel_index(choice, self.shape)
        info = {
            "gamma": self.gammas[gi],
            "weight": np.asarray(self.options.weights)[mi],
            "shift": np.asarray(self.options.shifts)[di],
        }
        if self.variants > 1:
            info["moved"] = moved.astype(bool)  # took the copy moved by the per-prompt shift
        beta_index = _mode(k)
        return StepOutput(
            asarray_like(values[..., None], rewards),
            self.table.betas[beta_index]
            if beta_index.ndim
            else float(self.table.betas[beta_index]),
            beta_index if beta_index.ndim else int(beta_index),
            info,
        )


def _mode(index: np.ndarray) -> np.ndarray:
    """The most frequent value along the last axis (ties: the smallest)."""
    top = int(index.max()) + 1 if index.size else 1
    counts = (index[..., None] == np.arange(top)).sum(axis=-2)
    return np.argmax(counts, axis=-1)


register_estimator(
    "basis_memory",
    uses_cache=True,
    options=MemoryOptions,
    kernel=MemoryKernel,
    description="BASIS memory: Beta posterior with the tilted value as prior and the prompt's "
    "own past rollouts.",
    reward_bounds=(0.0, 1.0),
)
