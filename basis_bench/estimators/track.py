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
SHIFTS = (-2.0, -1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0, 2.0, 3.0)  # delta candidates (log-odds)
RATES = (0.0, 0.03, 0.1, 0.3, 1.0, 3.0)  # rho candidates (log-odds variance)
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
    """What one step serves each prompt of the batch (all (S, B) but ``posterior``)."""

    shift: np.ndarray  # d_i, log-odds
    var: np.ndarray  # v_i, log-odds^2
    delta: np.ndarray  # the leave-one-out increments delta_-i, rho_-i
    rho: np.ndarray
    bins: np.ndarray  # the prompt's value bin k(i)
    posterior: np.ndarray  # (S, C) the increments' posterior given the whole batch


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
        shifts, rates = np.meshgrid(SHIFTS, RATES, indexing="ij")
        self.delta, self.rho = shifts.ravel(), rates.ravel()  # (C,) the joint candidates
        self.multipliers = np.asarray(MULTIPLIERS)

    def initial_state(self, lead: tuple[int, ...]) -> dict[str, np.ndarray]:
        p = self.prior.shape[0]
        return {
            "weights": np.broadcast_to(self.prior, (*lead, *self.prior.shape)).copy(),
            "last_shift": np.zeros((*lead, p)),
            "last_drift": np.zeros((*lead, p)),
            "clocks": np.zeros((*lead, 2)),  # S, C
            "increment_counts": np.zeros((*lead, len(self.delta))),
            "bin_loglik": np.zeros((*lead, len(BIN_EDGES) + 1, len(self.multipliers))),
        }

    def multiplier(self, state: dict[str, np.ndarray]) -> np.ndarray:
        """h_k (S, K): the posterior mean multiplier of each bin (flat prior on the grid)."""
        return _softmax(state["bin_loglik"]) @ self.multipliers

    def serve(
        self, state: dict[str, np.ndarray], w: np.ndarray, cols: np.ndarray, r: np.ndarray
    ) -> Served:
        """Each prompt's drift from the clocks, with this step's increments fitted on the
        batch without the prompt. Flat streams S: w (S, B, G), cols and r (S, B)."""
        s, b = cols.shape
        clocks = state["clocks"]
        pend_s = clocks[:, :1] - np.take_along_axis(state["last_shift"], cols, -1)
        pend_c = np.maximum(clocks[:, 1:] - np.take_along_axis(state["last_drift"], cols, -1), 0)
        mean = np.einsum("sbg,sbg->sb", w, _sigmoid(self.theta + pend_s[..., None]))
        bins = np.searchsorted(BIN_EDGES, mean)
        h = np.take_along_axis(self.multiplier(state), bins, -1)
        x = self.theta + (pend_s[..., None] + self.delta)[..., None]  # (S, B, C, G)
        var = h[..., None] * (pend_c[..., None] + self.rho)
        p = _chunked_predictive(w.reshape(s * b, -1), x.reshape(s * b, *x.shape[2:]),
                                var.reshape(s * b, -1)).reshape(s, b, -1)  # fmt: skip
        ll = _loglik(p, r[..., None])  # (S, B, C)
        counts = state["increment_counts"] + self.options.pseudo_count / len(self.delta)
        log_prior = np.log(counts / counts.sum(axis=-1, keepdims=True))[:, None, :]
        total = ll.sum(axis=1, keepdims=True)
        loo = _softmax(log_prior + total - ll)  # (S, B, C): prompt i's increments without r_i
        delta, rho = loo @ self.delta, loo @ self.rho
        return Served(
            pend_s + delta, h * (pend_c + rho), delta, rho, bins, _softmax(log_prior + total)[:, 0]
        )

    def learn(
        self, state: dict[str, np.ndarray], w: np.ndarray, r: np.ndarray, served: Served
    ) -> None:
        """After the step: the clocks advance by the increments' posterior mean, the prior
        weights take its responsibilities (online EM), each bin's multiplier evidence the
        log-likelihood of its rewards under every multiplier (the served shift and increments
        held)."""
        lam = self.options.memory
        post = served.posterior
        state["clocks"][:, 0] += post @ self.delta
        state["clocks"][:, 1] += post @ self.rho
        state["increment_counts"] *= lam
        state["increment_counts"] += post
        s, b = r.shape
        x = self.theta + np.broadcast_to(served.shift[..., None, None], (s, b, 1, 1))
        x = np.broadcast_to(x, (s, b, len(self.multipliers), len(self.theta)))
        unit = served.var / np.maximum(np.take_along_axis(self.multiplier(state), served.bins, -1), 1e-300)
        var = unit[..., None] * self.multipliers
        p = predictive(w.reshape(s * b, -1), x.reshape(s * b, *x.shape[2:]), var.reshape(s * b, -1))
        ll = _loglik(p.reshape(s, b, -1), r[..., None])  # (S, B, M)
        onehot = served.bins[..., None] == np.arange(len(BIN_EDGES) + 1)  # (S, B, K)
        state["bin_loglik"] *= lam
        state["bin_loglik"] += np.einsum("sbk,sbm->skm", onehot, ll)

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
        # the clock values the prompt's new posterior stands at: before this step's advance,
        # plus the increments it was served
        seen = flat["clocks"][:, None, :] + np.stack([served.delta, served.rho], axis=-1)
        self.learn(flat, w, r, served)
        np.put_along_axis(flat["weights"], c[..., None], post, axis=1)
        np.put_along_axis(flat["last_shift"], c, seen[..., 0], axis=1)
        np.put_along_axis(flat["last_drift"], c, seen[..., 1], axis=1)
        for key, value in flat.items():  # a no-op for the views a contiguous state gives
            state[key][...] = value.reshape(state[key].shape)
        return StepOutput(asarray_like(baseline.reshape(r_all.shape)[..., None], rewards))


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
