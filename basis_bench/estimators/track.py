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

The drift comes from two clocks per stream, S (a shift) and C (a variance), that every step
advances by increments (delta_t, rho_t) shared by the batch; a prompt last seen at clock
values (S_i, C_i) gets

    d_i = S - S_i + delta,   v_i = h_k(i) (C - C_i + rho),

so the drift grows with the steps since the prompt's last visit as the clock ran meanwhile
(a jump of the policy is a burst of the clock that every prompt not yet revisited inherits),
and h_k, k the prompt's value bin, scales it by where the prompt stands. Learned online,
from rewards already seen only:

* (delta_t, rho_t): a candidate grid with a prior mixture weight each; prompt i is served
  the posterior mean of the increments given the batch's OTHER rewards (leave-one-out), the
  clocks then advance by the posterior mean given the whole batch;
* the mixture weights: online EM (the whole batch's posterior responsibilities, discounted
  by ``memory`` per step, plus ``pseudo_count`` per candidate);
* h_k: the posterior mean over a multiplier grid given the discounted log-likelihood of the
  bin's past rewards under each multiplier (history only).

The candidates are scored with the probit approximation E sigmoid(x + sqrt(v) z) ≈
sigmoid(x / sqrt(1 + pi v / 8)); the served posterior is propagated exactly on the grid.
b_i is a function of the cache, the history and r_{-i}: the advantage is unbiased given the
history. Every grid value sigmoid(theta_g) is strictly inside (0, 1), so is b_i.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np

from basis_bench.errors import InputError
from basis_bench.estimators._array import Array, RewardRange, asarray_like, check_rewards, to_numpy
from basis_bench.estimators.output import StepOutput
from basis_bench.estimators.registry import EstimatorInput, register_estimator
from basis_bench.estimators.table import TiltTable
from basis_bench.settings import check_settings, setting

GRID_POINTS = 64
THETA_MAX = 8.0  # sigmoid(8) = 0.99966: the grid's values stay strictly inside (0, 1)
JEFFREYS = 0.5
LEVEL_NOISE = (0.001, 0.01, 0.1, 1.0)  # q: the common level's random-walk variance per step
LEVEL_PRIOR_VAR = 4.0  # the common level's variance before any reward: sd 2 in log-odds
RATES = (0.0, 0.003, 0.01, 0.03, 0.1)  # rho: drift variance per step since the last visit
JUMP_SCALES = (0.0, 0.25, 0.5, 1.0, 2.0)  # kappa: drift variance per squared level move
MULTIPLIERS = (0.25, 0.5, 1.0, 2.0, 4.0)  # h_k candidates
BIN_EDGES = (0.1, 0.3, 0.7, 0.9)  # value bins of "where the prompt stands"
MEMORY = 0.95
PSEUDO_COUNT = 1.0
_P_CLIP = 1e-12
_FLOOR = 1e-250  # posterior weights below this are raised to it: no denormals, no lost cell
_CHUNK_ELEMENTS = 1 << 21  # candidate predictions evaluated at a time


@dataclass(frozen=True)
class TrackOptions:
    """Options of ``basis_track``: how far back its online fits of the drift remember."""

    estimator: ClassVar[str] = "basis_track"
    memory: float = setting(
        MEMORY,
        help="Per-step discount in [0, 1) of the evidence the drift's prior weights and bin "
        "multipliers are fitted on (0: the latest step alone).",
        min_val=0.0,
        max_val=1.0,
        include_boundaries="left",
    )
    pseudo_count: float = setting(
        PSEUDO_COUNT,
        help="Pseudo-count > 0 of the learned prior over the drift candidates, spread evenly "
        "over them: how surprised the tracker may be by a jump it has not seen yet.",
        min_val=0.0,
        include_boundaries="right",
    )

    def __post_init__(self) -> None:
        check_settings(self, lambda name: f"{self.estimator}.{name}")


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
    no mass leaves the grid). var = 0 is the identity."""
    g = w.shape[-1]
    k = (np.arange(g)[:, None] - np.arange(g)[None, :]) * spacing  # (G', G) theta_g' - theta_g
    out = np.empty_like(w)
    step = max(1, _CHUNK_ELEMENTS // (g * g))
    for a in range(0, len(w), step):
        z = slice(a, a + step)
        v = np.maximum(var[z], 1e-12)[:, None, None]
        kern = np.exp(-(k * k) / (2.0 * v))  # (n, G', G)
        kern /= kern.sum(axis=1, keepdims=True)
        out[z] = np.einsum("nhg,ng->nh", kern, w[z])
    return out


def propagate(
    w: np.ndarray, shift: np.ndarray, var: np.ndarray, theta: np.ndarray
) -> np.ndarray:
    """The posterior before a visit: w (N, G) moved by ``shift`` (N,) in log-odds, then
    blurred by N(0, var)."""
    spacing = float(theta[1] - theta[0])
    return blur(shift_mass(w, shift / spacing), var, spacing)


def reward_update(w: np.ndarray, r: np.ndarray, sig: np.ndarray) -> np.ndarray:
    """Bayes' rule with the (fractional) Bernoulli likelihood s^r (1 - s)^(1 - r): exact for
    r in {0, 1}, and for r in (0, 1) the likelihood of a reward with mean s."""
    post = w * sig**r[:, None] * (1.0 - sig) ** (1.0 - r[:, None])
    post /= post.sum(axis=-1, keepdims=True)
    return np.maximum(post, _FLOOR)


def predictive(w: np.ndarray, x: np.ndarray, var: np.ndarray) -> np.ndarray:
    """Approximate P(r = 1) after a move by x and a drift of variance var, per candidate:
    sum_g w_g sigmoid((theta_g + x) / sqrt(1 + pi var / 8)). w (N, G) holds theta_g's
    weights with theta_g already added (``w`` paired with ``theta`` by the caller through
    ``x`` (N, C, G)); var (N, C). The probit approximation, used to score candidates only."""
    scale = 1.0 / np.sqrt(1.0 + math.pi * var / 8.0)
    return np.einsum("ng,ncg->nc", w, _sigmoid(x * scale[..., None]))


def _loglik(p: np.ndarray, r: np.ndarray) -> np.ndarray:
    p = np.clip(p, _P_CLIP, 1.0 - _P_CLIP)
    return r * np.log(p) + (1.0 - r) * np.log1p(-p)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class Served(NamedTuple):
    """What one step serves each prompt of the batch (flat streams S, batch B)."""

    shift: np.ndarray  # (S, B) d_i, log-odds
    var: np.ndarray  # (S, B) v_i, log-odds^2
    unit: np.ndarray  # (S, B) v_i / h_k(i): the variance before the bin's multiplier
    bins: np.ndarray  # (S, B) the prompt's value bin k(i)
    levels: np.ndarray  # (S, B, Q) each level filter's leave-one-out level, u_{q,-i}
    level_pred: np.ndarray  # (S, B, Q) the predictions each level filter is updated with
    loglik: np.ndarray  # (S, C) the batch's log-likelihood of every candidate


class TrackKernel:
    """``basis_track`` on the step interface (:mod:`basis_bench.estimators.step`)."""

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
        q, rho, kappa = np.meshgrid(LEVEL_NOISE, RATES, JUMP_SCALES, indexing="ij")
        self.shape = q.shape  # (Q, rates, jump scales)
        self.q_index = np.repeat(np.arange(len(LEVEL_NOISE)), q[0].size)  # (C,)
        self.rho, self.kappa = rho.ravel(), kappa.ravel()
        self.multipliers = np.asarray(MULTIPLIERS)

    def initial_state(self, lead: tuple[int, ...]) -> dict[str, np.ndarray]:
        p, nq = self.prior.shape[0], len(LEVEL_NOISE)
        return {
            "weights": np.broadcast_to(self.prior, (*lead, *self.prior.shape)).copy(),
            "step": np.zeros(lead),
            "last_visit": np.zeros((*lead, p)),
            "level": np.zeros((*lead, nq)),
            "level_var": np.full((*lead, nq), LEVEL_PRIOR_VAR),
            "last_level": np.zeros((*lead, p, nq)),
            "evidence": np.zeros((*lead, self.rho.size)),
            "bin_loglik": np.zeros((*lead, len(BIN_EDGES) + 1, len(self.multipliers))),
        }

    def multiplier(self, state: dict[str, np.ndarray]) -> np.ndarray:
        """h_k (S, K): the posterior mean multiplier of each bin (flat prior on the grid)."""
        return _softmax(state["bin_loglik"]) @ self.multipliers

    def candidates(
        self, w: np.ndarray, moved: np.ndarray, gap: np.ndarray, h: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every candidate's drift (S, B, C): shift d = moved[q] (the level moved since the
        visit), variance h (rho gap + kappa d^2); and its predictive P(r = 1) (S, B, C)."""
        d = moved[..., self.q_index]
        var = h[..., None] * (self.rho * gap[..., None] + self.kappa * d * d)
        s, b, c = d.shape
        x = self.theta + d[..., None]
        p = _chunked_predictive(w.reshape(s * b, -1), x.reshape(s * b, c, -1), var.reshape(s * b, c))
        return d, p.reshape(s, b, c)

    def serve(
        self, state: dict[str, np.ndarray], w: np.ndarray, cols: np.ndarray, r: np.ndarray
    ) -> Served:
        """Each prompt's drift, every fitted quantity from the history and the batch's OTHER
        rewards. Flat streams S: w (S, B, G), cols and r (S, B)."""
        gap = state["step"][:, None] - np.take_along_axis(state["last_visit"], cols, -1)
        last = np.take_along_axis(state["last_level"], cols[..., None], 1)  # (S, B, Q)
        bins = np.searchsorted(BIN_EDGES, w @ self.sig)
        h = np.take_along_axis(self.multiplier(state), bins, -1)
        _, p = self.candidates(w, state["level"][:, None, :] - last, gap, h)
        ll = _loglik(p, r[..., None])  # (S, B, C): history-only predictions
        total = ll.sum(axis=1)
        # each level filter's leave-one-out step, on its own predictions averaged over the
        # other parameters by their evidence so far
        within = _softmax(state["evidence"].reshape(*state["evidence"].shape[:-1], len(LEVEL_NOISE), -1))
        pq = np.einsum("sbqk,sqk->sbq", p.reshape(*p.shape[:2], *within.shape[1:]), within)
        levels = _loo_levels(state, r, pq)  # (S, B, Q)
        d, p_served = self.candidates(w, levels - last, gap, h)
        post = _softmax(state["evidence"][:, None, :] + total[:, None, :] - ll)  # (S, B, C)
        shift = np.einsum("sbc,sbc->sb", post, d)
        unit = np.einsum("sbc,sbc->sb", post, self.rho * gap[..., None] + self.kappa * d * d)
        return Served(shift, h * unit, unit, bins, levels, pq, total)

    def learn(
        self, state: dict[str, np.ndarray], w: np.ndarray, cols: np.ndarray, r: np.ndarray,
        served: Served,
    ) -> None:  # fmt: skip
        """After the step: the evidence of every candidate takes the batch's log-likelihood,
        each level filter the whole batch, each bin's multiplier evidence its rewards'
        log-likelihood under every multiplier (the served shift held); the batch's prompts
        are marked visited at this step and at their served levels."""
        lam = self.options.memory
        state["evidence"] += served.loglik
        state["evidence"] *= lam
        s, b = r.shape
        x = np.broadcast_to(
            (self.theta + served.shift[..., None])[:, :, None, :],
            (s, b, len(self.multipliers), len(self.theta)),
        )
        var = served.unit[..., None] * self.multipliers
        p = predictive(w.reshape(s * b, -1), x.reshape(s * b, *x.shape[2:]), var.reshape(s * b, -1))
        ll = _loglik(p.reshape(s, b, -1), r[..., None])  # (S, B, M)
        onehot = served.bins[..., None] == np.arange(len(BIN_EDGES) + 1)  # (S, B, K)
        state["bin_loglik"] *= lam
        state["bin_loglik"] += np.einsum("sbk,sbm->skm", onehot, ll)
        np.put_along_axis(state["last_level"], cols[..., None], served.levels, axis=1)
        np.put_along_axis(state["last_visit"], cols, state["step"][:, None], axis=1)
        state["step"] += 1

    def step(self, state: dict[str, np.ndarray], cols: np.ndarray, rewards: Array) -> StepOutput:
        check_rewards(rewards, self.reward_range)
        r_all = to_numpy(rewards[..., 0], dtype=np.float64)
        if np.any((r_all < 0) | (r_all > 1)):
            raise InputError("basis_track's Bernoulli likelihood needs rewards in [0, 1]")
        srt = np.sort(cols, axis=-1)
        if np.any(srt[..., 1:] == srt[..., :-1]):
            raise InputError("basis_track takes each prompt at most once per batch")
        lead, b = cols.shape[:-1], cols.shape[-1]
        flat = {k: v.reshape(math.prod(lead), *v.shape[len(lead) :]) for k, v in state.items()}
        c, r = cols.reshape(-1, b), r_all.reshape(-1, b)
        w = np.take_along_axis(flat["weights"], c[..., None], axis=1)  # (S, B, G)
        served = self.serve(flat, w, c, r)
        s = len(c)
        w_now = propagate(
            w.reshape(s * b, -1), served.shift.ravel(), served.var.ravel(), self.theta
        )
        baseline = (w_now @ self.sig).reshape(s, b)
        post = reward_update(w_now, r.ravel(), self.sig).reshape(s, b, -1)
        self.learn(flat, w, c, r, served)
        _level_update(flat, r, served)
        np.put_along_axis(flat["weights"], c[..., None], post, axis=1)
        for key, value in flat.items():  # a no-op for the views a contiguous state gives
            state[key][...] = value.reshape(state[key].shape)
        return StepOutput(asarray_like(baseline.reshape(r_all.shape)[..., None], rewards))


def _level_precision(state: dict[str, np.ndarray], pq: np.ndarray) -> np.ndarray:
    """Each level filter's posterior precision after the batch (S, Q): 1 / (V + q) + sum_j
    p_j (1 - p_j), the Laplace approximation of the batch's Bernoulli likelihood."""
    return 1.0 / (state["level_var"] + np.asarray(LEVEL_NOISE)) + (pq * (1 - pq)).sum(axis=1)


def _loo_levels(state: dict[str, np.ndarray], r: np.ndarray, pq: np.ndarray) -> np.ndarray:
    """u_{q,-i} (S, B, Q): one Newton step of each level filter on the batch without prompt i,
    u + (sum_j e_j - e_i) / (Lambda - c_i), e = r - p, c = p (1 - p)."""
    e, c = r[..., None] - pq, pq * (1 - pq)
    lam = _level_precision(state, pq)[:, None, :]
    return state["level"][:, None, :] + (e.sum(axis=1, keepdims=True) - e) / (lam - c)


def _level_update(state: dict[str, np.ndarray], r: np.ndarray, served: Served) -> None:
    """The same step on the whole batch: u <- u + sum_j e_j / Lambda, V <- 1 / Lambda."""
    lam = _level_precision(state, served.level_pred)
    state["level"] += (r[..., None] - served.level_pred).sum(axis=1) / lam
    state["level_var"][...] = 1.0 / lam


def _chunked_predictive(w: np.ndarray, x: np.ndarray, var: np.ndarray) -> np.ndarray:
    """:func:`predictive` a block of rows at a time (its (N, C, G) temporaries stay small)."""
    out = np.empty(var.shape)
    step = max(1, _CHUNK_ELEMENTS // (x.shape[1] * x.shape[2]))
    for a in range(0, len(w), step):
        z = slice(a, a + step)
        out[z] = predictive(w[z], x[z], var[z])
    return out


@register_estimator(
    "basis_track",
    uses_cache=True,
    options=TrackOptions,
    kernel=TrackKernel,
    label="BASIS track",
    colour="darkorange",
)
def _basis_track(batch: EstimatorInput, options: TrackOptions) -> Array:
    """BASIS track: a per-prompt Bayesian filter on the log-odds, its drift learned across prompts online."""
    raise InputError("basis_track is stateful; use make_step_estimator or trajectory replay")
