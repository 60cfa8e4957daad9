"""basis_track's step as it stood before its numpy work was compiled (main at eee2e6e),
verbatim but for its registration, the definitions it shares with basis_track now (imported)
and the two compiled loops that moved to track_loops: the reference the compiled step is
held to bit for bit (see test_kernels_before.py)."""

from __future__ import annotations

import math
from typing import Any

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
from basis_bench.estimators.table import TiltTable
from basis_bench.estimators.tilt import sigmoid
from basis_bench.estimators.track import (
    DIFFICULTY_EDGES,
    JUMP_MEMORY,
    JUMP_PRIOR,
    JUMP_VAR,
    LEVEL_NOISE,
    LEVEL_PRIOR_VAR,
    REGIMES,
    TrackOptions,
    candidate_grid,
    logit_grid,
    prior_weights,
)

_P_CLIP = 1e-12
_FLOOR = 1e-250
_SPREAD_FLOOR = 1e-12


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


def _loglik(p: np.ndarray, r: np.ndarray) -> np.ndarray:
    p = np.clip(p, _P_CLIP, 1.0 - _P_CLIP)
    return r * np.log(p) + (1.0 - r) * np.log1p(-p)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def level_step(
    level: np.ndarray, var: np.ndarray, rate: np.ndarray, resid: np.ndarray, curv: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The common level's update on a batch (arrays broadcast): the batch's residual sum E =
    sum_j (r_j - p_j) with sensitivity H = sum_j p_j (1 - p_j), the level calm (step variance
    LEVEL_NOISE[0]) or jumping (LEVEL_NOISE[1]) with prior probability ``rate``. Under each,
    E ~ N(0, H + H^2 (V + q)) (Laplace), and the level's Newton step u + E / (1 / (V + q) + H);
    the two collapsed by their posterior weights (an interacting-multiple-model step).
    Returns the level, its variance and the jump's posterior probability."""
    out = []
    for q in LEVEL_NOISE:
        prior = var + q
        # a batch whose predictions are all 0 or 1 carries no information on the level; its
        # sensitivity may round below 0 (p (1 - p) of a p a rounding above 1): floored
        spread = np.maximum(curv + curv**2 * prior, _SPREAD_FLOOR)
        log_ev = -0.5 * (np.log(spread) + resid**2 / spread)
        post_var = 1.0 / (1.0 / prior + curv)
        out.append((log_ev, level + resid * post_var, post_var))
    (ev_c, u_c, v_c), (ev_j, u_j, v_j) = out
    jumped = 1.0 / (1.0 + (1.0 - rate) / rate * np.exp(ev_c - ev_j))
    mean = (1 - jumped) * u_c + jumped * u_j
    spread = (1 - jumped) * (v_c + (u_c - mean) ** 2) + jumped * (v_j + (u_j - mean) ** 2)
    return mean, spread, jumped


def _sum_without(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """sum_{j != i} x_j along ``axis`` (the last or the one before it), as the sum of the
    terms before i and the terms after i: no x_i enters it, not even as rounding (total -
    x_i would carry x_i's). A compiled loop (:func:`track_loops.sum_without`)."""
    from basis_bench.estimators import track_loops

    x = np.ascontiguousarray(x, dtype=np.float64)
    flat = x.reshape(-1, x.shape[axis], 1 if axis == -1 else x.shape[-1])
    out = np.empty_like(flat)
    track_loops.sum_without(flat, out)
    return out.reshape(x.shape)


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

    def initial_state(self, lead: tuple[int, ...]) -> dict[str, np.ndarray]:
        p, c = self.prior.shape[0], len(self.models)
        return {
            "weights": np.broadcast_to(self.prior, (*lead, c, *self.prior.shape)).copy(),
            "step": np.zeros(lead),
            "last_visit": np.zeros((*lead, p)),
            "level": np.zeros((*lead, c)),
            "level_var": np.full((*lead, c), LEVEL_PRIOR_VAR),
            "jumps": np.zeros((*lead, c)),  # discounted count of the level's jump steps
            # the expected number of level jumps so far, and at each prompt's last visit:
            # the reference counts as its regime's R jumps before the first step
            "jump_clock": np.broadcast_to(self.regimes[:, 1], (*lead, c)).copy(),
            "last_jump_clock": np.zeros((*lead, c, p)),
            "last_level": np.zeros((*lead, c, p)),
            "evidence": np.zeros((*lead, c, len(DIFFICULTY_EDGES) + 1)),  # per difficulty bin
        }

    def step(self, state: dict[str, np.ndarray], cols: np.ndarray, rewards: Array) -> StepOutput:
        check_rewards(rewards, self.reward_range)
        r_all = to_numpy(rewards[..., 0], dtype=np.float64)
        if np.any((r_all < 0) | (r_all > 1)):
            raise InputError("basis_track's Bernoulli likelihood needs rewards in [0, 1]")
        lead, b = cols.shape[:-1], cols.shape[-1]
        flat = {k: v.reshape(math.prod(lead), *v.shape[len(lead) :]) for k, v in state.items()}
        baseline = self._step(flat, cols.reshape(-1, b), r_all.reshape(-1, b))
        for key, value in flat.items():  # a contiguous state's are views, written in place
            if not np.may_share_memory(value, state[key]):
                state[key][...] = value.reshape(state[key].shape)
        return StepOutput(asarray_like(baseline.reshape(r_all.shape)[..., None], rewards))

    def jump_rate(self, state: dict[str, np.ndarray]) -> np.ndarray:
        """epsilon (S, C): the posterior mean jump probability of the level per step, from the
        discounted count of past steps' jump posteriors (online EM) and a Beta prior."""
        steps = (1.0 - JUMP_MEMORY ** state["step"]) / (1.0 - JUMP_MEMORY)  # sum of lam^age
        return (state["jumps"] + JUMP_PRIOR) / (steps[:, None] + self.regimes[:, 0])

    def _mixing(
        self, evidence: np.ndarray, where: np.ndarray, ll: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each prompt's weights over the filters (S, B, C), and the batch's log-likelihoods
        by filter and difficulty bin (S, C, K). ``where`` (S, B): each prompt's bin k_i. Its
        weights: softmax over c of (1 - w) a_{c,k_i} + w sum_k a_{c,k} (w = ``pooling``),
        a_{c,k} = evidence[c, k] + the log-likelihoods of the batch's OTHER prompts in bin k:
        a bin's own evidence, with the other bins' as its prior at weight w."""
        from basis_bench.estimators import track_loops

        mixed, counts = np.empty(ll.shape), np.empty(evidence.shape)  # (S, C, B), (S, C, K)
        track_loops.track_mixing(evidence, where, ll, self.options.pooling, mixed, counts)
        return _softmax(mixed.swapaxes(1, 2)), counts

    def _step(self, state: dict[str, np.ndarray], cols: np.ndarray, r: np.ndarray) -> np.ndarray:
        """One step of S flat streams, cols and r (S, B); the baselines (S, B). The batch's
        rows of the state are read and written by flat index, (stream, filter, prompt) one
        row of G cells; a filter that cannot jump (eta J = 0) skips the jump's terms, which
        enter with weight 0 (x + 0 y = x: the same numbers)."""
        from basis_bench.estimators import loops  # numba, imported on first use

        s, b = cols.shape
        c, g = len(self.models), len(self.theta)
        p = self.prior.shape[0]
        rho, kappa, eta = (self.models[:, j][None, :, None] for j in range(3))  # (1, C, 1)
        stream = np.arange(s)[:, None]
        rows = (((stream[..., None] * c + np.arange(c)[:, None]) * p) + cols[:, None, :]).ravel()
        visits = (stream * p + cols).ravel()  # (S B,) into the flat (S P) last visits
        weights = state["weights"].reshape(-1, g)  # (S C P, G), a view
        last_levels = state["last_level"].reshape(-1)
        last_clocks = state["last_jump_clock"].reshape(-1)
        last_visit = state["last_visit"].reshape(-1)
        gap = (state["step"][:, None] - last_visit.take(visits).reshape(s, b))[:, None]
        last = last_levels.take(rows).reshape(s, c, b)
        last_jumps = last_clocks.take(rows).reshape(s, c, b)
        # 1. history only: each filter's prediction at its level before this batch
        moved = (state["level"][..., None] - last).ravel()
        jumps0 = state["jump_clock"][..., None] - last_jumps
        var0 = (rho * gap + kappa * jumps0).ravel()
        jump0 = (1.0 - np.exp(-eta * jumps0)).ravel()
        pred, moments = _predict(weights, rows, moved, var0, jump0, self.theta)
        p0 = pred.reshape(s, c, b)
        ll = _loglik(p0, r[:, None, :])  # (S, C, B)
        # 2. each filter's level on the batch without prompt i, calm or jumping
        p0 = np.clip(p0, 0.0, 1.0)  # a mixture of sigmoids may round a hair past 1
        e, curv = r[:, None, :] - p0, p0 * (1.0 - p0)
        rate = self.jump_rate(state)[..., None]
        level_loo, _, jumped_loo = level_step(
            state["level"][..., None], state["level_var"][..., None], rate,
            _sum_without(e), _sum_without(curv),
        )  # fmt: skip
        shift = (level_loo - last).ravel()
        jumps = state["jump_clock"][..., None] + jumped_loo - last_jumps
        var = (rho * gap + kappa * jumps).ravel()
        jump = (1.0 - np.exp(-eta * jumps)).ravel()
        copies, likelihood, which = _likelihood_lines(self.sig, cols, r, c)
        # every prompt once (the replay's batches): each row's posterior updated as it is
        # made (nothing below reads the weights); a prompt twice: the update waits for its
        # first copy's posterior (below)
        w_now, value = _drift(
            weights, rows, moments, shift, var, jump, self.theta, self.sig,
            (likelihood, which) if copies is None else None,
        )  # fmt: skip
        # 3. the filters mixed by the evidence of the prompt's difficulty bin (history only)
        mix, counts = self._mixing(state["evidence"], self.difficulty[cols], ll)
        baseline = np.einsum("sbc,scb->sb", mix, value.reshape(s, c, b))
        # 4. learn: evidence, levels, posteriors (if not updated in the drift), visits
        lam = self.options.memory
        state["evidence"] += counts
        state["evidence"] *= lam
        level, level_var, jumped = level_step(
            state["level"], state["level_var"], rate[..., 0], e.sum(-1), curv.sum(-1)
        )
        state["level"][...], state["level_var"][...] = level, level_var
        state["jumps"] *= JUMP_MEMORY
        state["jumps"] += jumped
        if copies is not None:  # every copy writes its first copy's numbers
            w_now, level_loo, jumped_loo = _fold_copies(
                copies, w_now.reshape(s, c, b, g), level_loo, jumped_loo
            )
            loops.track_update(w_now.reshape(-1, g), likelihood, which, weights, rows, _FLOOR)
        last_levels[rows] = level_loo.ravel()
        last_clocks[rows] = (state["jump_clock"][..., None] + jumped_loo).ravel()
        state["jump_clock"] += jumped
        last_visit[visits] = np.repeat(state["step"], b)
        state["step"] += 1
        return baseline


def _predict(
    weights: np.ndarray, rows: np.ndarray, moved: np.ndarray, var: np.ndarray,
    jump: np.ndarray, theta: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Each row's prediction (N,) before the visit: (1 - jump) predictive(var) + jump
    predictive(var + JUMP_VAR) of the posterior weights[rows] moved by ``moved``; a row that
    cannot jump (jump = 0) takes the first term alone (x + 0 y = x). And each row's
    posterior moments (N, 2), for the redrawn posterior. The rows' arithmetic runs in a
    compiled loop (:mod:`basis_bench.estimators.predict_loops`)."""
    from basis_bench.estimators import predict_loops

    p, moments = np.empty(len(rows)), np.empty((len(rows), 2))
    order = np.arange(len(rows))  # the rows in order (the loop's argument since)
    predict_loops.track_predict(weights, rows, order, moved, var, jump, theta, JUMP_VAR, p, moments)
    return p, moments


def _drift(
    weights: np.ndarray, rows: np.ndarray, moments: np.ndarray, shift: np.ndarray,
    var: np.ndarray, jump: np.ndarray, theta: np.ndarray, sig: np.ndarray,
    update: tuple[np.ndarray, np.ndarray] | None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Each row's posterior before the visit (N, G), weights[rows] moved by ``shift``,
    blurred by N(0, var) and mixed with the redrawn one, (1 - jump) propagated + jump
    redrawn (a row that cannot jump: the propagated one alone; the redrawn: a Gaussian on
    the grid with the old posterior's mean moved by ``shift`` and its variance widened by
    var + JUMP_VAR), and its value (N,). With ``update`` (a likelihood table and each row's
    line of it, distinct rows), each posterior is updated into weights[rows] instead of
    returned (the first result then one row of scratch)."""
    from basis_bench.estimators import loops

    likelihood, which = (
        update if update is not None else (np.empty((0, len(theta))), np.empty(0, np.intp))
    )
    out = np.empty((1 if update is not None else len(rows), len(theta)))
    values = np.empty(len(rows))
    loops.track_drift(
        weights, rows, shift, var, jump, moments, theta, sig, JUMP_VAR, out, values,
        likelihood, which, _FLOOR,
    )  # fmt: skip
    return out, values


def _likelihood_lines(
    sig: np.ndarray, cols: np.ndarray, r: np.ndarray, c: int
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """Which rows of the batch (S, B) are the same prompt (None: every prompt once), and the
    likelihood table and line (:func:`_likelihoods`) of each row (S, C, B) in order: its own
    reward, or with a prompt twice in a batch (a training batch across two epochs) every
    copy's, so that the state is one posterior."""
    copies = same_prompt(cols)
    if copies is None:
        wins, visits = r, np.ones_like(r)
    else:
        wins, visits = np.einsum("sij,sj->si", copies, r), copies.sum(-1).astype(np.float64)
    return (
        copies,
        *_likelihoods(
            sig,
            np.repeat(wins[:, None, :], c, 1).ravel(),
            np.repeat(visits[:, None, :], c, 1).ravel(),
        ),
    )


def _fold_copies(
    copies: np.ndarray, w: np.ndarray, level: np.ndarray, jumped: np.ndarray
) -> tuple[np.ndarray, ...]:
    """What each row writes into its prompt's state when a prompt is twice in a batch: its
    first copy's filters w (S, C, B, G), levels and jumps (S, C, B)."""
    first = np.broadcast_to(np.argmax(copies, axis=-1)[:, None, :], level.shape)
    return (
        np.take_along_axis(w, first[..., None], axis=2),
        np.take_along_axis(level, first, axis=2),
        np.take_along_axis(jumped, first, axis=2),
    )
