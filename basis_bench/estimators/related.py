"""Estimators of related work, registered beside BASIS so one benchmark compares them all.

    james_stein  (Zeng, Zhou, Arora, Zanette 2025, "Shrinking the variance"), G rollouts:
                 b_ik = (1 - lam_i) RLOO_ik + lam_i mbar_{-i},   lam_i = v2_{-i} / (v2_{-i} + s2_{-i} + eps)
                 from the OTHER prompts j != i of the batch: mbar_{-i} = mean of their group means
                 (= mean of their rewards, groups being equal), v2_{-i} = mean_j S_j^2 / G with S_j^2
                 the unbiased (ddof = 1) variance of group j, s2_{-i} = mean_j (m_j - mbar_{-i})^2.
    apo          (Brantley et al. 2025, A*-PO), one rollout + cache: the optimal soft value of the
                 KL-regularised objective, V*(x) = beta log E_ref[exp(r / beta)], estimated from the
                 cached reference rewards (beta = 0.5 as A*-PO's stage-1 beta_1).
    SpoTracker   (Xu & Ding 2025, SPO): a Beta(alpha, beta) posterior per prompt, initialised from
                 the reference cache and decayed each time the prompt is seen; stateful across steps,
                 registered as ``spo_tracker`` with a step kernel (:class:`SpoKernel`): it has no
                 one-step call and runs through make_step_estimator and trajectory replay.

PVPO's static reference baseline is the plain offline mean of the reference rollouts, which is
the registered ``reference_mean`` up to its smoothing, (k + a)/(n + 2a) instead of k/n, a shift of
at most a/(n + 2a) (0.008 at n = 64); the one-step input carries only the smoothed table, so no
separate ``pvpo`` estimator is registered.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from array_api_compat import array_namespace

from basis_bench.errors import InputError
from basis_bench.estimators._array import (
    Array,
    RewardRange,
    asarray_like,
    check_rewards,
    to_numpy,
)
from basis_bench.estimators.options import (
    APO_BETA,
    JS_EPS,
    SPO_DECAY,
    ApoOptions,
    JamesSteinOptions,
    SpoOptions,
)
from basis_bench.estimators.output import StepOutput
from basis_bench.estimators.registry import EstimatorInput, register_estimator
from basis_bench.estimators.step import StepEstimator, make_step_estimator
from basis_bench.estimators.table import inf_index
from basis_bench.estimators.tilt import is_binary
from basis_bench.settings import check_scalar

__all__ = [
    "APO_BETA",
    "JS_EPS",
    "SPO_DECAY",
    "SpoKernel",
    "SpoTracker",
    "apo_value",
    "hermite_weights",
    "james_stein",
    "spo_prior",
    "spo_step",
]


# --------------------------------------------------------------------------- James-Stein


def james_stein(rewards: Array, eps: float = JS_EPS, reward_range: RewardRange = None) -> Array:
    """James-Stein shrinkage of RLOO towards the other prompts' mean: (..., B, G) -> (..., B, G).

    Every statistic of prompt i comes from the other B - 1 groups (batch totals minus prompt i's
    own term), so b_ik never uses r_ik and the policy gradient stays unbiased.
    """
    _check_js_shape(rewards)
    check_rewards(rewards, reward_range)
    return _james_stein_kernel(rewards, eps)


def _check_js_shape(rewards: Array) -> None:
    if rewards.ndim < 2 or rewards.shape[-1] < 2 or rewards.shape[-2] < 2:
        raise InputError(
            "james_stein needs (..., B, G) rewards with B >= 2 prompts and G >= 2 rollouts each; "
            f"got shape {tuple(rewards.shape)}"
        )


def _james_stein_kernel(rewards: Array, eps: float) -> Array:
    xp = array_namespace(rewards)
    b, g = rewards.shape[-2], rewards.shape[-1]
    means = xp.mean(rewards, axis=-1)  # (..., B)
    # Centre on the batch mean first: the leave-one-out variance below is a difference of sums.
    centred = means - xp.mean(means, axis=-1, keepdims=True)
    group_var = xp.sum((rewards - means[..., None]) ** 2, axis=-1) / (g - 1) / g
    others = b - 1
    loo_mean = (xp.sum(centred, axis=-1, keepdims=True) - centred) / others
    loo_sq = (xp.sum(centred * centred, axis=-1, keepdims=True) - centred * centred) / others
    s2 = xp.clip(loo_sq - loo_mean * loo_mean, 0.0, None)
    v2 = (xp.sum(group_var, axis=-1, keepdims=True) - group_var) / others
    lam = v2 / (v2 + s2 + eps)
    other_mean = loo_mean + xp.mean(means, axis=-1, keepdims=True)
    rloo = (xp.sum(rewards, axis=-1, keepdims=True) - rewards) / (g - 1)
    return (1 - lam)[..., None] * rloo + (lam * other_mean)[..., None]


@register_estimator("james_stein", group=True, options=JamesSteinOptions)
def _james_stein(batch: EstimatorInput, options: JamesSteinOptions) -> Array:
    """James-Stein (G): RLOO shrunk towards the other prompts' mean (Zeng et al. 2025)."""
    _check_js_shape(batch.rewards)
    return _james_stein_kernel(batch.rewards, options.eps)


# --------------------------------------------------------------------------- A*-PO


def _check_beta(beta: float) -> float:
    check_scalar(
        beta, "the A*-PO beta", float, min_val=0, include_boundaries="neither", allow_inf=True
    )
    return float(beta)


def apo_value(ref_rewards: Array, beta: float = APO_BETA, prior: float = 0.5) -> Array:
    """A*-PO's offline value V^*(x) = beta log mean_m exp(r_m / beta) per prompt: (P, n) -> (P,).

    NaN marks a missing sample. Binary rewards use the smoothed rate p = (k + a)/(n + 2a) of the
    cache, as BASIS's tilt does, so V^* = beta log(1 - p + p e^{1/beta}); continuous rewards use
    the plain log-mean-exp. beta = inf gives the (smoothed) mean; beta -> 0 the best reward.
    """
    beta = _check_beta(beta)
    xp = array_namespace(ref_rewards)
    if ref_rewards.ndim != 2:
        raise InputError(
            f"ref_rewards must be (prompts, samples); got shape {tuple(ref_rewards.shape)}"
        )
    seen = ~xp.isnan(ref_rewards)
    n = xp.sum(xp.astype(seen, ref_rewards.dtype), axis=1)
    if bool(xp.any(n == 0)):
        raise InputError(
            "a prompt has no cached reference rewards (all NaN); drop it or add samples"
        )
    r = xp.where(seen, ref_rewards, 0.0)
    if is_binary(ref_rewards):
        p = (xp.sum(r, axis=1) + prior) / (n + 2 * prior)
        return _binary_soft_value(p, beta)
    if math.isinf(beta):
        return xp.sum(r, axis=1) / n
    z = xp.where(seen, r / beta, -math.inf)
    top = xp.max(z, axis=1)
    lse = top + xp.log(xp.sum(xp.exp(z - top[:, None]), axis=1))
    return beta * (lse - xp.log(n))


def _binary_soft_value(p: Array, beta: float) -> Array:
    """beta log(1 - p + p e^{1/beta}) per prompt: the soft value of a Bernoulli(p) reward."""
    xp = array_namespace(p)
    if math.isinf(beta):
        return p
    s = 1.0 / beta
    # log((1 - p) + p e^s) = s + log(p + (1 - p) e^{-s}): no overflow however small beta is.
    return beta * (s + xp.log(p + (1 - p) * math.exp(-s)))


def hermite_weights(
    betas: Sequence[float] | np.ndarray, beta: float
) -> tuple[np.ndarray, np.ndarray]:
    """Weights (a, c) with log E_ref[e^{r/beta}] ~= sum_k a_k V_k + c_k Var_k over a beta grid.

    The cumulant K(s) = log E_ref[e^{s r}] has K' = V_s (the tilted value) and K'' = Var_s
    (the tilted variance), so K(1/beta) = integral_0^{1/beta} V_s ds. The grid gives V and its
    derivative at s_k = 1/beta_k; the integral of their piecewise cubic Hermite interpolant is
    a fixed linear combination of the grid rows. The grid must contain beta = inf (s = 0) and
    reach 1/beta.
    """
    b = np.asarray(betas, dtype=np.float64)
    s = np.where(np.isinf(b), 0.0, 1.0 / b)
    target = 0.0 if math.isinf(beta) else 1.0 / beta
    if not np.any(s == 0.0):
        raise InputError("apo needs beta = inf in the grid (the reference mean, s = 0)")
    if target > s.max() * (1 + 1e-12):
        raise InputError(
            f"apo's beta {beta} is below the grid's smallest beta {1 / s.max():g}; widen the grid"
        )
    order = np.argsort(s, kind="stable")
    ss = s[order]
    a = np.zeros_like(s)
    c = np.zeros_like(s)
    for k in range(len(ss) - 1):  # K + 1 grid points: a loop over the grid, not over prompts
        lo, hi = ss[k], ss[k + 1]
        if lo >= target or hi == lo:
            continue
        h = hi - lo
        t = min(1.0, (target - lo) / h)
        # Integrals over [0, t] of the Hermite basis h00, h10, h01, h11.
        i00 = t**4 / 2 - t**3 + t
        i10 = t**4 / 4 - 2 * t**3 / 3 + t**2 / 2
        i01 = -(t**4) / 2 + t**3
        i11 = t**4 / 4 - t**3 / 3
        a[order[k]] += h * i00
        a[order[k + 1]] += h * i01
        c[order[k]] += h * h * i10
        c[order[k + 1]] += h * h * i11
    return a, c


@register_estimator("apo", uses_cache=True, options=ApoOptions)
def _apo(batch: EstimatorInput, options: ApoOptions) -> Array:
    """A*-PO: offline soft value beta log E_ref[e^{r/beta}], beta = 0.5 (Brantley et al. 2025)."""
    beta = options.beta
    assert batch.v_grid is not None
    if batch.betas is None or batch.var_grid is None:
        raise InputError("apo needs the beta grid (betas) and var_grid in its input")
    xp = array_namespace(batch.v_grid)
    betas = to_numpy(batch.betas)
    inf = inf_index(betas)
    if inf is None:
        raise InputError("apo needs beta = inf in the grid (the reference mean)")
    v, var = batch.v_grid, batch.var_grid
    if bool(xp.all(xp.abs(var - v * (1 - v)) <= 1e-12)):
        # Binary cache: the table is the smoothed-rate closed form, so V^* is exact from p.
        return _binary_soft_value(v[inf, ...], beta)[..., None]
    a, c = hermite_weights(betas, beta)
    shape = (len(a),) + (1,) * (v.ndim - 1)
    wa = xp.reshape(asarray_like(a, v), shape)
    wc = xp.reshape(asarray_like(c, v), shape)
    log_mgf = xp.sum(wa * v + wc * var, axis=0)
    value = v[inf, ...] if math.isinf(beta) else beta * log_mgf
    return value[..., None]


# --------------------------------------------------------------------------- SPO tracker


def spo_prior(
    ref_rewards: np.ndarray,
    decay: float = SPO_DECAY,
    prior: float = 0.5,
    weight: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Initial Beta parameters (alpha, beta), each (P,), from the (P, n) reference cache.

    p0 = (k + a)/(n + 2a) (SPO's recipe uses a = 0.5: (k + 0.5)/(n + 1)) and an effective
    prior count N0 = ``weight``, by default 1/(1 - decay), the steady-state count of a filter
    that forgets at rate ``decay``: alpha0 = N0 p0, beta0 = N0 (1 - p0). NaN = missing sample.
    """
    check_scalar(decay, "decay", float, min_val=0, max_val=1, include_boundaries="right")
    ref = np.asarray(ref_rewards, dtype=np.float64)
    if ref.ndim != 2:
        raise InputError(f"ref_rewards must be (prompts, samples); got shape {ref.shape}")
    seen = ~np.isnan(ref)
    n = seen.sum(axis=1)
    if np.any(n == 0) and prior == 0:
        raise InputError(
            "a prompt has no cached reference rewards and prior = 0; its value is undefined"
        )
    if np.any((ref[seen] < 0) | (ref[seen] > 1)):
        raise InputError("the SPO tracker's Beta posterior needs rewards in [0, 1]")
    n0 = 1.0 / (1.0 - decay) if weight is None else float(weight)
    if decay == 1 and weight is None:
        raise InputError("decay = 1 never forgets; give the prior weight explicitly")
    check_scalar(n0, "the prior weight", float, min_val=0, include_boundaries="neither")
    p0 = (np.where(seen, ref, 0.0).sum(axis=1) + prior) / (n + 2 * prior)
    return n0 * p0, n0 * (1 - p0)


def spo_step(
    alpha: np.ndarray, beta: np.ndarray, index: np.ndarray, rewards: np.ndarray, decay: float
) -> np.ndarray:
    """One tracker step, in place: baselines alpha/(alpha + beta) of ``index``, then the update.

    alpha, beta: (..., P) state; index, rewards: (..., B) the batch's prompt columns and rewards.
    The baselines are read before the update (each reward is scored by the value it has not
    seen). Update of a prompt seen once: alpha <- decay alpha + r, beta <- decay beta + (1 - r);
    a prompt seen c times in one batch is updated as c such steps in batch order.
    """
    lead = alpha.shape[:-1]
    if index.shape[:-1] != lead or rewards.shape != index.shape:
        raise InputError(
            f"tracker shapes disagree: state {alpha.shape}, index {index.shape}, rewards {rewards.shape}"
        )
    p = alpha.shape[-1]
    if index.size and (index.min() < 0 or index.max() >= p):
        raise InputError(f"prompt index out of range [0, {p})")
    if np.any((rewards < 0) | (rewards > 1)) or not np.all(np.isfinite(rewards)):
        raise InputError("the SPO tracker's Beta posterior needs finite rewards in [0, 1]")
    flat_a, flat_b = alpha.reshape(-1), beta.reshape(-1)
    offsets = (np.arange(int(np.prod(lead, dtype=np.int64))) * p).reshape(*lead, 1)
    cell = (index + offsets).reshape(-1)
    r = rewards.reshape(-1)
    baselines = (flat_a[cell] / (flat_a[cell] + flat_b[cell])).reshape(index.shape)
    # Occurrences of the same cell after this one in batch order: the later decays it sees.
    order = np.argsort(cell, kind="stable")
    sorted_cell = cell[order]
    starts = np.flatnonzero(np.r_[True, sorted_cell[1:] != sorted_cell[:-1]])
    counts = np.diff(np.r_[starts, cell.size])
    rank = np.arange(cell.size) - np.repeat(starts, counts)
    later = np.empty(cell.size, dtype=np.int64)
    later[order] = np.repeat(counts, counts) - rank - 1
    unique = sorted_cell[starts]
    weight = decay**later
    flat_a[unique] *= decay**counts
    flat_b[unique] *= decay**counts
    np.add.at(flat_a, cell, weight * r)
    np.add.at(flat_b, cell, weight * (1 - r))
    return baselines


SPO_TRACKER_NAME = "spo_tracker"


def SpoTracker(
    prompt_ids: Sequence[str],
    ref_rewards: Array,
    decay: float = SPO_DECAY,
    prior: float = 0.5,
    weight: float | None = None,
    options: SpoOptions | None = None,
) -> StepEstimator:
    """SPO's single-stream value tracker: ``make_step_estimator("spo_tracker", ...)``.

    ``tracker(prompt_ids, rewards)`` with rewards (B,) returns the baselines
    b_i = alpha_i / (alpha_i + beta_i) of the batch's prompts before it sees their rewards,
    then decays and updates them (state ``alpha``, ``beta``: one Beta posterior per prompt).
    The decay is a constant forgetting factor per sighting (SPO's KL-adaptive rho needs the
    policies' log-probabilities, which a replay of stored rewards does not have).
    """
    opts = options or SpoOptions(decay=decay, prior=prior, weight=weight)
    return make_step_estimator(
        SPO_TRACKER_NAME, opts, prompt_ids=prompt_ids, ref_rewards=ref_rewards
    )


class SpoKernel:
    """The SPO tracker on the shared step interface: state (alpha, beta), each (*lead, P).

    :func:`spo_prior`, then :func:`spo_step` per batch, for any number of parallel streams,
    so trajectory replay, the training loop and the plug-ins carry it alike
    (``make_step_estimator("spo_tracker", ...)``).
    """

    def __init__(
        self,
        estimator: Any,
        options: SpoOptions,
        table: Any,
        ref_rewards: np.ndarray | None,
        reward_range: RewardRange,
    ) -> None:
        if ref_rewards is None:
            raise InputError("the SPO tracker needs the reference cache's rewards")
        self.options = options
        self.alpha0, self.beta0 = spo_prior(
            to_numpy(ref_rewards, dtype=np.float64), options.decay, options.prior, options.weight
        )
        self.reward_range = reward_range

    def initial_state(self, lead: tuple[int, ...]) -> dict[str, np.ndarray]:
        shape = (*lead, self.alpha0.shape[0])
        return {
            "alpha": np.broadcast_to(self.alpha0, shape).copy(),
            "beta": np.broadcast_to(self.beta0, shape).copy(),
        }

    def step(self, state: dict[str, np.ndarray], cols: np.ndarray, rewards: Array) -> StepOutput:
        check_rewards(rewards, self.reward_range)
        r = to_numpy(rewards[..., 0], dtype=np.float64)
        out = spo_step(state["alpha"], state["beta"], cols, r, self.options.decay)
        return StepOutput(asarray_like(out[..., None], rewards))


register_estimator(
    SPO_TRACKER_NAME,
    uses_cache=True,
    options=SpoOptions,
    kernel=SpoKernel,
    description="SPO tracker: a Beta posterior per prompt, decayed per sighting (Xu & Ding 2025); "
    "stateful.",
    reward_bounds=(0.0, 1.0),
)
