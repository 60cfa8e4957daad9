"""``basis_track``: one rollout per prompt and step, a per-prompt Bayesian filter whose drift
between visits is learned across prompts online (docs/method.md, "A per-prompt Bayesian
tracker").

Each prompt's value is sigmoid(theta_i); its posterior over theta_i lives on a fixed grid of
log-odds theta_g (G points on [-THETA_MAX, THETA_MAX]), exact for Bernoulli rewards:

    prior       pi_i(theta) ∝ sigmoid(theta)^(k_i + a) (1 - sigmoid(theta))^(n_i - k_i + a)
                (k_i of n_i cached reference rewards, a = Jeffreys' 1/2: the reference's
                smoothed rate, BASIS's offline estimate at beta = inf)
    drift       before a visit: theta_i <- theta_i + d_i + sqrt(v_i) z,  z ~ N(0, 1)
    baseline    b_i = sum_g pi_i'(theta_g) sigmoid(theta_g)      (the predictive mean)
    update      pi_i''(theta) ∝ pi_i'(theta) sigmoid(theta)^r (1 - sigmoid(theta))^(1 - r)

Drift between visits, for prompt i at step t (last visited at step t_i):

    d_i = u_t - u_{t_i}                       the common level's move (the policy's shared drift)
    v_i = rho (t - t_i) + kappa J_i           a random walk, plus kappa per level jump
    w.p. 1 - exp(-eta J_i) the prompt was redrawn: its log-odds ~ N(old mean + d_i, old
    variance + v_i + JUMP_VAR), a heavy tail that one surprising reward can pick out

u is one filter of the common level per stream: each step it is calm (random-walk variance
LEVEL_NOISE[0]) or jumps (LEVEL_NOISE[1]), and the batch's residuals decide which (an
interacting-multiple-model step); J_i counts the level's expected jumps since the prompt's
last visit (the reference counts as R jumps before the first step). Learned online, from
rewards already seen only:

* the level, its variance and its jump rate epsilon (online EM: the discounted count of the
  steps' jump posteriors under a Beta(1/2, w - 1/2) prior, memory JUMP_MEMORY);
* theta = (rho, kappa, eta, regime), how far a prompt drifts by its steps since the last
  visit and by the policy's jumps, and whether the policy moves (w = 5, R = 1) or stands
  after one large gap from the reference (w = 50, R = 3): C filters run side by side, one
  per theta of the grid, and are mixed by their evidence, the discounted (``memory``)
  log-likelihood of every reward they predicted before seeing it: empirical Bayes by
  marginal likelihood over theta;
* where the prompt stands: the evidence is kept per difficulty bin (the reference's smoothed
  rate, DIFFICULTY_EDGES), and a prompt's filters are mixed by its bin's evidence with the
  other bins' at weight ``pooling`` (1, the default: one drift model for every prompt).

Leave-one-out: prompt i's level step and its filters' mixing weights use the batch's OTHER
rewards and the history, never r_i (sums without i are sums of the terms before and after
i, so not even rounding carries r_i): the advantage r_i - b_i is unbiased given the history.
The predictions behind the evidence and the level's step use the probit approximation E
sigmoid(x + sqrt(v) z) ≈ sigmoid(x / sqrt(1 + pi v / 8)); the served posterior is moved,
blurred and updated exactly on the grid. Every grid value sigmoid(theta_g) is strictly inside
(0, 1), so is b_i.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

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
from basis_bench.estimators.output import StepOutput
from basis_bench.estimators.registry import register_estimator
from basis_bench.estimators.table import TiltTable
from basis_bench.estimators.tilt import sigmoid
from basis_bench.settings import check_settings, setting

GRID_POINTS = 64
THETA_MAX = 8.0  # sigmoid(8) = 0.99966: the grid's values stay strictly inside (0, 1)
JEFFREYS = 0.5
LEVEL_NOISE = (1e-4, 4.0)  # the common level's step variance: calm, or a jump of the policy
JUMP_PRIOR = 0.5  # the Beta prior of the jump probability: Beta(1/2, w - 1/2), w its weight
# the policy's regime, a dimension of the bank: moving (the jump prior a jump per 10 steps,
# worth 5 steps; the reference one jump away) or standing (a jump per 100 steps, worth 50;
# the reference 3 jumps away: one large gap, then calm)
REGIMES = ((5.0, 1.0), (50.0, 3.0))  # (the jump prior's weight w, the reference's jumps)
JUMP_MEMORY = (
    0.99  # per-step discount of the jump count: jumps are rare, their rate needs long memory
)
LEVEL_PRIOR_VAR = 4.0  # the common level's variance before any reward: sd 2 in log-odds
RATES = (0.0, 0.02)  # rho: drift variance per step since the last visit
JUMP_SCALES = (0.0, 1.0)  # kappa: drift variance per jump of the level since the last visit
JUMP_RATES = (0.0, 1.0)  # eta: J jumps of the level redraw the prompt w.p. 1 - exp(-eta J)
JUMP_VAR = 4.0  # a redrawn prompt's log-odds: its old posterior moved, widened by sd 2
# where a prompt stands: bins of its difficulty (the reference's smoothed rate), each bin
# with its own evidence over the drift models
DIFFICULTY_EDGES = (0.1, 0.3, 0.7, 0.9)
MEMORY = 0.95
_FLOOR = 1e-250  # posterior weights below this are raised to it: no denormals, no lost cell
# the state a step learns besides the posteriors, in track_loops.advance's order
_LEARNT = (
    "step", "last_visit", "level", "level_var", "jumps", "jump_clock", "visit_level",
    "visit_jump_clock",
)  # fmt: skip


@dataclass(frozen=True)
class TrackOptions:
    """Options of ``basis_track``: how far back its evidence over the drift models reaches."""

    estimator: ClassVar[str] = "basis_track"
    memory: float = setting(
        MEMORY,
        help="Per-step discount in [0, 1] of the log-likelihood by which the drift models are "
        "weighed (0: the latest step alone, 1: every step alike).",
        min_val=0.0,
        max_val=1.0,
    )
    pooling: float = setting(
        1.0,
        help="Weight in [0, 1] of the other difficulty bins' evidence in a bin's choice of drift "
        "model (1: one drift model for every prompt; below 1: the drift depends on where "
        "the prompt stands, each bin shrunk to the pooled choice by this weight).",
        min_val=0.0,
        max_val=1.0,
    )

    def __post_init__(self) -> None:
        check_settings(self, lambda name: f"{self.estimator}.{name}")


def logit_grid(points: int = GRID_POINTS) -> np.ndarray:
    """The fixed log-odds grid theta_g (G,), evenly spaced on [-THETA_MAX, THETA_MAX]."""
    return np.linspace(-THETA_MAX, THETA_MAX, points)


def prior_weights(ref_rewards: np.ndarray, theta: np.ndarray, a: float = JEFFREYS) -> np.ndarray:
    """Each prompt's prior on the grid (P, G): the reference's k of n (fractional rewards add
    their values to k), pi(theta) ∝ s^(k + a) (1 - s)^(n - k + a), s = sigmoid(theta): the
    Beta(k + a, n - k + a) posterior of the rate, written in log-odds (its Jacobian s(1 - s)
    adds 1 to each exponent)."""
    seen = np.isfinite(ref_rewards)
    k = np.where(seen, ref_rewards, 0.0).sum(axis=1)[:, None]
    n = seen.sum(axis=1)[:, None]
    log_s, log_f = -np.logaddexp(0.0, -theta), -np.logaddexp(0.0, theta)
    logw = (k + a) * log_s + (n - k + a) * log_f
    w = np.exp(logw - logw.max(axis=1, keepdims=True))
    return w / w.sum(axis=1, keepdims=True)


def _likelihoods(sig: np.ndarray, r: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Bernoulli likelihood s^r (1 - s)^(n - r) of r successes in n rollouts on the grid
    (exact for r in {0, .., n}, and for fractional r the likelihood of rewards with mean s),
    as a table (L, G) and each row's line of it (N,): 1 - s and s for a single 0/1 reward
    (rows 0 and 1: no power an element), a line of its own for any other."""
    single = (n == 1.0) & ((r == 0.0) | (r == 1.0))
    which = r.astype(np.intp)
    other = np.flatnonzero(~single)
    which[other] = 2 + np.arange(len(other))
    nn, rr = n[other, None], r[other, None]
    table = np.concatenate([[1.0 - sig, sig], sig**rr * (1.0 - sig) ** (nn - rr)])
    return table, which


def candidate_grid() -> np.ndarray:
    """The drift models (C, 4): every (rho, kappa, eta, regime) of the grids (regime: an index
    into REGIMES), one filter each."""
    grid = np.meshgrid(RATES, JUMP_SCALES, JUMP_RATES, range(len(REGIMES)), indexing="ij")
    return np.stack([g.ravel() for g in grid], axis=-1)


class TrackKernel:
    """``basis_track`` on the step interface (:mod:`basis_bench.estimators.step`): C filters
    side by side, one per drift model, mixed by their evidence."""

    def __init__(
        self,
        estimator: Any,
        options: TrackOptions,
        table: TiltTable | None,
        ref_rewards: np.ndarray | None,
        reward_range: RewardRange,
    ) -> None:
        if ref_rewards is None:
            raise InputError("basis_track needs the reference cache's rewards")
        self.options, self.reward_range = options, reward_range
        self.theta = logit_grid()
        self.sig = sigmoid(self.theta)
        self.prior = prior_weights(to_numpy(ref_rewards, dtype=np.float64), self.theta)
        self.models = candidate_grid()  # (C, 4)
        self.regimes = np.array(REGIMES)[self.models[:, 3].astype(int)]  # (C, 2)
        self.difficulty = np.searchsorted(DIFFICULTY_EDGES, self.prior @ self.sig)  # (P,) bins
        self.drift = np.ascontiguousarray(self.models[:, :3])  # (C, 3): rho, kappa, eta
        self.weight = np.ascontiguousarray(self.regimes[:, 0])  # (C,) the jump prior's weight
        self.noise = np.array(LEVEL_NOISE)
        self.lines = np.stack([1.0 - self.sig, self.sig])  # a 0/1 reward's likelihood lines

    def initial_state(self, lead: tuple[int, ...]) -> dict[str, np.ndarray]:
        (p, g), c = self.prior.shape, self.drift.shape[0]
        state = {
            # each prompt's C filters' posteriors on the grid, side by side (the row loops
            # take a prompt's filters one after another: adjacent rows, adjacent reads)
            "posteriors": np.empty((*lead, p, c, g)),
            "step": np.empty(lead),
            "last_visit": np.empty((*lead, p)),
            "level": np.empty((*lead, c)),
            "level_var": np.empty((*lead, c)),
            "jumps": np.empty((*lead, c)),  # discounted count of the level's jump steps
            # the expected number of level jumps so far, and at each prompt's last visit
            "jump_clock": np.empty((*lead, c)),
            # each prompt's filters' level and jump clock at its last visit (P, C): side by
            # side, as the posteriors
            "visit_jump_clock": np.empty((*lead, p, c)),
            "visit_level": np.empty((*lead, p, c)),
            "evidence": np.empty((*lead, c, len(DIFFICULTY_EDGES) + 1)),  # per difficulty bin
        }
        self.reset_state(state)
        return state

    def reset_state(self, state: dict[str, np.ndarray]) -> None:
        """The initial state, written into ``state`` (made by :meth:`initial_state`): every
        posterior the prior; the level at 0 with variance LEVEL_PRIOR_VAR; the reference
        its regime's R jumps before the first step; the rest 0."""
        state["posteriors"][...] = self.prior[:, None, :]
        state["level_var"][...] = LEVEL_PRIOR_VAR
        state["jump_clock"][...] = self.regimes[:, 1]
        for key in ("step", "last_visit", "level", "jumps", "visit_jump_clock", "visit_level",
                    "evidence"):  # fmt: skip
            state[key][...] = 0.0

    def step(self, state: dict[str, np.ndarray], cols: np.ndarray, rewards: Array) -> StepOutput:
        """The rewards are checked where they are read (:func:`track_loops.gather`) when
        that reads them all (one rollout each) and the declared range holds [0, 1]: the
        check's messages, without a pass of its own over them."""
        lo, hi = self.reward_range or (0.0, 1.0)
        checked = rewards.shape[-1] == 1 and lo <= 0.0 and hi >= 1.0
        if not checked:
            check_rewards(rewards, self.reward_range)
        r_all = to_numpy(rewards[..., 0], dtype=np.float64)
        lead, b = cols.shape[:-1], cols.shape[-1]
        if len(lead) == 1:  # the state's own arrays: (S, ...) already
            baseline = self._step(state, cols, r_all, rewards)
        else:
            flat = {k: v.reshape(math.prod(lead), *v.shape[len(lead) :]) for k, v in state.items()}
            baseline = self._step(flat, cols.reshape(-1, b), r_all.reshape(-1, b), rewards)
            for key, value in flat.items():  # a contiguous state's are views, written in place
                if not np.may_share_memory(value, state[key]):
                    state[key][...] = value.reshape(state[key].shape)
        return StepOutput(asarray_like(baseline.reshape(r_all.shape)[..., None], rewards))

    def _reject(self, rewards: Array) -> None:
        """A reward outside [0, 1] or not a number: check_rewards' message where it has
        one, else the likelihood's."""
        check_rewards(rewards, self.reward_range)
        raise InputError("basis_track's Bernoulli likelihood needs rewards in [0, 1]")

    def _step(
        self, state: dict[str, np.ndarray], cols: np.ndarray, r: np.ndarray, rewards: Array
    ) -> np.ndarray:
        """One step of S flat streams, cols and r (S, B) (``rewards`` as given, for a
        rejection's message); the baselines (S, B). The batch's rows of the state are read
        and written by flat index, (stream, prompt, filter) one row of G cells, a prompt's
        filters one after another (:mod:`track_loops`); a filter that cannot jump (eta J =
        0) skips the jump's terms, which enter with weight 0 (x + 0 y = x: the same
        numbers). The arithmetic on (S, C, B) arrays is compiled (:mod:`track_loops`) but
        for its exponentials and logarithms, numpy's, one call each on one buffer; the
        rows' between (the predictions' :mod:`predict_loops`, the drift's :mod:`loops`)."""
        from basis_bench.estimators import predict_loops, track_loops  # numba, on first use

        s, b = cols.shape
        c, g = len(self.models), len(self.theta)
        n, m = s * c * b, s * c
        cols, r = np.ascontiguousarray(cols, np.intp), np.ascontiguousarray(r, np.float64)
        weights = state["posteriors"].reshape(-1, g)  # (S P C, G), a view
        rows, which, gap = np.empty(n, np.intp), np.empty(n, np.intp), np.empty((s, b))
        first, order = np.empty((s, b), np.intp), np.empty(n, np.intp)
        work, levels = np.empty((track_loops.WORK, n)), np.empty((3, m))
        # 1. history only: each filter's prediction at its level before this batch
        flags = track_loops.gather(
            state["step"], state["last_visit"], state["level"], state["jump_clock"],
            state["visit_level"], state["visit_jump_clock"], cols, r, self.drift, rows, order,
            gap, first, which, work,
        )  # fmt: skip
        if flags & track_loops.OUTSIDE:
            self._reject(rewards)
        pred, moments = np.empty(n), np.empty((n, 2))
        jump0 = 1.0 - np.exp(work[track_loops.NEG])
        predict_loops.track_predict(
            weights, rows, order, work[track_loops.MOVED], work[track_loops.VAR], jump0,
            self.theta, JUMP_VAR, pred, moments,
        )  # fmt: skip
        # 2. each filter's level on the batch without prompt i, calm or jumping, and the
        # filters' mixing by the evidence of the prompt's difficulty bin (history only)
        spreads, neg_p = np.empty(3 * n + 2 * m), np.empty(n)
        track_loops.residuals(
            pred, r, state["level_var"], state["jumps"], JUMP_MEMORY ** state["step"],
            self.weight, JUMP_PRIOR, self.noise, JUMP_MEMORY, work, levels, spreads, neg_p,
        )  # fmt: skip
        exps = np.empty(2 * n + m)
        track_loops.scores(
            spreads, np.log(spreads), np.log1p(neg_p), r, self.difficulty[cols],
            state["evidence"], self.options.pooling, self.options.memory, work, levels, exps,
        )  # fmt: skip
        exps = np.exp(exps)
        # 3. learn the levels and visits; each row's drift, value and (if every prompt is
        # once in the batch) its posterior's update, written as it is made
        track_loops.advance(
            exps, cols, gap, first, self.drift, self.noise, JUMP_MEMORY, work, levels,
            tuple(state[k] for k in _LEARNT),
        )  # fmt: skip
        likelihood = self.lines
        if flags:  # a prompt twice, or a fractional reward: their own likelihood lines
            likelihood, which = _likelihood_lines(self.sig, cols, r, c)
        copies = first if flags & track_loops.COPIES else None
        value = self._drift(state, rows, work, moments, (likelihood, which), copies)
        baseline = np.empty((s, b))  # the filters' softmax of exps[N + M:] over their values
        track_loops.mixed_values(exps[n + m :].reshape(s, c, b), value.reshape(s, b, c), baseline)
        return baseline

    def _drift(
        self, state: dict[str, np.ndarray], rows: np.ndarray, work: np.ndarray,
        moments: np.ndarray, update: tuple[np.ndarray, np.ndarray], first: np.ndarray | None,
    ) -> np.ndarray:  # fmt: skip
        """Each row's posterior before the visit, weights[rows] moved by work[MOVED], blurred
        by N(0, work[VAR]) and mixed with the redrawn one w.p. 1 - e^work[NEG]
        (:func:`loops.track_drift`; the rows in the loops' order, :mod:`track_loops`), its
        value (N,) returned in that order, and its Bayes update by
        ``update`` (a likelihood table and each row's line of it) written into the state:
        as it is made where every prompt is once in the batch; else once every row's is
        made, each copy of a prompt writing its first copy's (``first`` (S, B): the batch's
        first row of each row's prompt)."""
        from basis_bench.estimators import loops, track_loops

        g = len(self.theta)
        weights = state["posteriors"].reshape(-1, g)
        jump = 1.0 - np.exp(work[track_loops.NEG])
        none = np.empty((0, g)), np.empty(0, np.intp)
        out, value = np.empty((1 if first is None else len(rows), g)), np.empty(len(rows))
        likelihood, which = update if first is None else none
        loops.track_drift(
            weights, rows, work[track_loops.MOVED], work[track_loops.VAR], jump, moments,
            self.theta, self.sig, JUMP_VAR, out, value, likelihood, which, _FLOOR,
        )  # fmt: skip
        if first is not None:
            s, b = first.shape
            posts = np.take_along_axis(out.reshape(s, b, -1, g), first[:, :, None, None], axis=1)
            loops.track_update(posts.reshape(-1, g), *update, weights, rows, _FLOOR)
        return value


def _likelihood_lines(
    sig: np.ndarray, cols: np.ndarray, r: np.ndarray, c: int
) -> tuple[np.ndarray, np.ndarray]:
    """The likelihood table and each row's line of it (S B C,) (:func:`_likelihoods`; the
    row loops' order), in order: its own reward, or with a prompt twice in a batch (a
    training batch across two epochs) every copy's, so that the state is one posterior. A
    line for every row, each filter's too: numpy's power may round the same element
    differently in another shape."""
    copies = same_prompt(cols)
    if copies is None:
        wins, visits = r, np.ones_like(r)
    else:
        wins, visits = np.einsum("sij,sj->si", copies, r), copies.sum(-1).astype(np.float64)
    return _likelihoods(
        sig,
        np.repeat(wins[:, :, None], c, 2).ravel(),
        np.repeat(visits[:, :, None], c, 2).ravel(),
    )


register_estimator(
    "basis_track",
    uses_cache=True,
    options=TrackOptions,
    kernel=TrackKernel,
    description="BASIS track: a per-prompt Bayesian filter on the log-odds, its drift learned "
    "across prompts online.",
    reward_bounds=(0.0, 1.0),
)
