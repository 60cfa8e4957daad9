"""basis_track as it stood before issue 46 (main at ab7caf4), verbatim but for its
registration and options: the slow reference the faster kernel is held to (every output
equal to 1e-9 relative; see test_kernels_before.py)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

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
from basis_bench.estimators.track import (
    DIFFICULTY_EDGES,
    GRID_POINTS,
    JEFFREYS,
    JUMP_MEMORY,
    JUMP_PRIOR,
    JUMP_VAR,
    LEVEL_NOISE,
    LEVEL_PRIOR_VAR,
    REGIMES,
    THETA_MAX,
    TrackOptions,
    candidate_grid,
)

_P_CLIP = 1e-12
_FLOOR = 1e-250
_CHUNK_ELEMENTS = 1 << 21
_SPREAD_FLOOR = 1e-12


def logit_grid(points: int = GRID_POINTS) -> np.ndarray:
    """The fixed log-odds grid theta_g (G,), evenly spaced on [-THETA_MAX, THETA_MAX]."""
    return np.linspace(-THETA_MAX, THETA_MAX, points)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -z))


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


def shift_mass(w: np.ndarray, units: np.ndarray) -> np.ndarray:
    """w (N, G) moved by ``units`` (N,) grid steps: each cell's mass spread uniformly over the
    cell and moved, so the mean moves by exactly units * spacing; mass pushed past an edge
    stays in the edge cell. An integer move is a plain roll (with the edges piled)."""
    g = w.shape[-1]
    cm = np.concatenate([np.zeros((len(w), 1)), np.cumsum(w, axis=-1)], axis=-1)  # (N, G + 1)
    x = np.clip(np.arange(g + 1)[None, :] - units[:, None], 0.0, g)
    i0 = np.minimum(np.floor(x).astype(np.int64), g - 1)
    f = x - i0
    at = np.take_along_axis(cm, i0, -1) * (1 - f) + np.take_along_axis(cm, i0 + 1, -1) * f
    at[:, 0], at[:, -1] = 0.0, cm[:, -1]
    return np.diff(at, axis=-1)


def blur(w: np.ndarray, var: np.ndarray, spacing: float) -> np.ndarray:
    """w (N, G) convolved with N(0, var) (N,) on the grid: each cell's mass spread over the
    grid in proportion to the Gaussian density at the cells (normalised per source cell, so
    no mass leaves the grid). var = 0 is the identity. The kernel K[h, g] depends on h - g
    alone: the density at the 2G - 1 offsets is computed once per row and K is a view of
    it (dens[G - 1 + h - g], read as dens[G - 1 - h + g] since the density is even), so
    only 2G - 1 exponentials a row, not G^2; every term is a positive product, so tiny
    tail masses keep their relative precision."""
    g = w.shape[-1]
    d = np.arange(-(g - 1), g) * spacing  # (2G - 1,) the offsets theta_h - theta_g
    out = np.empty_like(w)
    step = max(1, _CHUNK_ELEMENTS // (g * g))
    for a in range(0, len(w), step):
        z = slice(a, a + step)
        dens = np.exp(-(d * d) / (2.0 * np.maximum(var[z], 1e-12)[:, None]))  # (n, 2G - 1)
        kern = sliding_window_view(dens, g, axis=-1)[:, ::-1, :]  # (n, G', G): K[h, g]
        out[z] = np.einsum("nhg,ng->nh", kern, w[z] / kern.sum(axis=1))
    return out


def propagate(w: np.ndarray, shift: np.ndarray, var: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """The posterior before a visit: w (N, G) moved by ``shift`` (N,) in log-odds, then
    blurred by N(0, var)."""
    spacing = float(theta[1] - theta[0])
    return blur(shift_mass(w, shift / spacing), var, spacing)


def redrawn(w: np.ndarray, shift: np.ndarray, var: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """The posterior of a prompt that jumped (N, G): a Gaussian on the grid with the old
    posterior's mean moved by ``shift`` and its variance widened by var + JUMP_VAR."""
    mean = w @ theta
    spread = w @ theta**2 - mean**2 + var + JUMP_VAR
    logw = -((theta - (mean + shift)[:, None]) ** 2) / (2.0 * spread[:, None])
    out = np.exp(logw - logw.max(axis=-1, keepdims=True))
    return out / out.sum(axis=-1, keepdims=True)


def reward_update(
    w: np.ndarray, r: np.ndarray, sig: np.ndarray, n: np.ndarray | float = 1.0
) -> np.ndarray:
    """Bayes' rule with the (fractional) Bernoulli likelihood s^r (1 - s)^(n - r) of r
    successes in n rollouts: exact for r in {0, .., n}, and for fractional r the likelihood
    of rewards with mean s."""
    n = np.asarray(n, dtype=np.float64)[..., None] if np.ndim(n) else n
    post = w * sig ** r[:, None] * (1.0 - sig) ** (n - r[:, None])
    post /= post.sum(axis=-1, keepdims=True)
    return np.maximum(post, _FLOOR)


def predictive(w: np.ndarray, shift: np.ndarray, var: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Approximate P(r = 1) (N,) after a move by ``shift`` and a drift of variance ``var``:
    sum_g w_g sigmoid((theta_g + shift) / sqrt(1 + pi var / 8)), the probit approximation of
    E sigmoid(x + sqrt(var) z). Used only where a prediction must hold no current reward
    (the evidence, the level's step); the served baseline is exact on the grid."""
    scale = 1.0 / np.sqrt(1.0 + math.pi * var / 8.0)
    return np.einsum("ng,ng->n", w, _sigmoid((theta + shift[:, None]) * scale[:, None]))


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


def _sum_without(x: np.ndarray) -> np.ndarray:
    """sum_{j != i} x_j along the last axis, as the sum of the terms before i and the terms
    after i: no x_i enters it, not even as rounding (total - x_i would carry x_i's)."""
    zero = np.zeros((*x.shape[:-1], 1))
    before = np.concatenate([zero, np.cumsum(x, axis=-1)[..., :-1]], axis=-1)
    after = np.concatenate([np.cumsum(x[..., ::-1], axis=-1)[..., -2::-1], zero], axis=-1)
    return before + after


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
        self.sig = _sigmoid(self.theta)
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
        for key, value in flat.items():  # a no-op for the views a contiguous state gives
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
        onehot = (where[..., None] == np.arange(evidence.shape[-1])).astype(float)  # (S, B, K)
        by_bin = ll[..., None] * onehot[:, None]  # (S, C, B, K)
        others = _sum_without(by_bin.swapaxes(-1, -2)).swapaxes(-1, -2)  # (S, C, B, K)
        score = evidence[:, :, None, :] + others
        own = np.take_along_axis(score, where[:, None, :, None], -1)[..., 0]  # (S, C, B)
        pool = self.options.pooling
        mixed = (1.0 - pool) * own + pool * score.sum(-1)
        return _softmax(mixed.swapaxes(1, 2)), by_bin.sum(2)

    def _step(self, state: dict[str, np.ndarray], cols: np.ndarray, r: np.ndarray) -> np.ndarray:
        """One step of S flat streams, cols and r (S, B); the baselines (S, B)."""
        s, b = cols.shape
        c, g = len(self.models), len(self.theta)
        rho, kappa, eta = (self.models[:, j][None, :, None] for j in range(3))  # (1, C, 1)
        idx = np.broadcast_to(cols[:, None, :], (s, c, b))
        w = np.take_along_axis(state["weights"], idx[..., None], axis=2)  # (S, C, B, G)
        gap = (state["step"][:, None] - np.take_along_axis(state["last_visit"], cols, 1))[:, None]
        last = np.take_along_axis(state["last_level"], idx, 2)  # (S, C, B)
        last_jumps = np.take_along_axis(state["last_jump_clock"], idx, 2)
        flat_w = w.reshape(-1, g)
        # 1. history only: each filter's prediction at its level before this batch
        moved = state["level"][..., None] - last
        jumps0 = state["jump_clock"][..., None] - last_jumps
        var0 = (rho * gap + kappa * jumps0).ravel()
        jump0 = (1.0 - np.exp(-eta * jumps0)).ravel()
        p0 = (1 - jump0) * predictive(flat_w, moved.ravel(), var0, self.theta) + jump0 * (
            predictive(flat_w, moved.ravel(), var0 + JUMP_VAR, self.theta)
        )
        p0 = p0.reshape(s, c, b)
        ll = _loglik(p0, r[:, None, :])  # (S, C, B)
        # 2. each filter's level on the batch without prompt i, calm or jumping
        p0 = np.clip(p0, 0.0, 1.0)  # a mixture of sigmoids may round a hair past 1
        e, curv = r[:, None, :] - p0, p0 * (1.0 - p0)
        rate = self.jump_rate(state)[..., None]
        level_loo, _, jumped_loo = level_step(
            state["level"][..., None], state["level_var"][..., None], rate,
            _sum_without(e), _sum_without(curv),
        )  # fmt: skip
        shift = level_loo - last
        jumps = state["jump_clock"][..., None] + jumped_loo - last_jumps
        var = (rho * gap + kappa * jumps).ravel()
        jump = (1.0 - np.exp(-eta * jumps)).ravel()[:, None]
        w_now = (1 - jump) * propagate(flat_w, shift.ravel(), var, self.theta)
        w_now += jump * redrawn(flat_w, shift.ravel(), var, self.theta)
        values = (w_now @ self.sig).reshape(s, c, b)
        # 3. the filters mixed by the evidence of the prompt's difficulty bin (history only)
        mix, counts = self._mixing(state["evidence"], self.difficulty[cols], ll)
        baseline = np.einsum("sbc,scb->sb", mix, values)
        # 4. learn: evidence, levels, posteriors, visits
        lam = self.options.memory
        state["evidence"] += counts
        state["evidence"] *= lam
        level, level_var, jumped = level_step(
            state["level"], state["level_var"], rate[..., 0], e.sum(-1), curv.sum(-1)
        )
        state["level"][...], state["level_var"][...] = level, level_var
        state["jumps"] *= JUMP_MEMORY
        state["jumps"] += jumped
        w_now, level_loo, jumped_loo, wins, visits = _fold_copies(
            cols, w_now.reshape(s, c, b, g), level_loo, jumped_loo, r
        )
        post = reward_update(
            w_now.reshape(-1, g),
            np.repeat(wins[:, None, :], c, 1).ravel(),
            self.sig,
            np.repeat(visits[:, None, :], c, 1).ravel(),
        )
        np.put_along_axis(state["weights"], idx[..., None], post.reshape(s, c, b, g), axis=2)
        np.put_along_axis(state["last_level"], idx, level_loo, axis=2)
        np.put_along_axis(
            state["last_jump_clock"], idx, state["jump_clock"][..., None] + jumped_loo, axis=2
        )
        state["jump_clock"] += jumped
        np.put_along_axis(state["last_visit"], cols, state["step"][:, None], axis=1)
        state["step"] += 1
        return baseline


def _fold_copies(
    cols: np.ndarray, w: np.ndarray, level: np.ndarray, jumped: np.ndarray, r: np.ndarray
) -> tuple[np.ndarray, ...]:
    """What each row writes into its prompt's state: its filters w (S, C, B, G), levels and
    jumps (S, C, B), and the successes and rollouts (S, B) its posterior takes. A prompt twice
    in a batch (a training batch across two epochs): every copy writes its first copy's
    filters and level, updated with all copies' rewards, so the state is one posterior."""
    copies = same_prompt(cols)
    if copies is None:
        return w, level, jumped, r, np.ones_like(r)
    first = np.broadcast_to(np.argmax(copies, axis=-1)[:, None, :], level.shape)
    return (
        np.take_along_axis(w, first[..., None], axis=2),
        np.take_along_axis(level, first, axis=2),
        np.take_along_axis(jumped, first, axis=2),
        np.einsum("sij,sj->si", copies, r),
        copies.sum(-1).astype(np.float64),
    )
