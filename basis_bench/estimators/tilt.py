"""Step 1 of BASIS: the offline value of the KL-tilted policy (the paper's eq. 4).

The KL-regularised optimum is pi*_beta(y|x) ∝ pi_ref(y|x) exp(r(x, y) / beta), whose value,
written with expectations under pi_ref only, is

    V*_beta(x) = E_ref[r e^{r/beta}] / E_ref[e^{r/beta}].

The plug-in estimate replaces both expectations by averages over the n cached reference
rewards. For binary rewards with reference success rate p this is a constant shift of the
log-odds, logit V_beta = logit p + 1/beta, so the rate is smoothed first,
p = (k + a) / (n + 2a) (a = ``prior``; 0.5 is Jeffreys), which keeps V_beta off 0 and 1.
Continuous rewards use the weighted average with log-sum-exp weights, which never overflow.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from array_api_compat import array_namespace

from basis_bench.errors import InputError
from basis_bench.estimators._array import Array, asarray_like, to_numpy
from basis_bench.estimators.options import DEFAULT_GRID_SIZE, DEFAULT_PRIOR
from basis_bench.settings import check_scalar

BETA_RANGE = (0.05, 50.0)


def default_betas(
    k: int = DEFAULT_GRID_SIZE, low: float = BETA_RANGE[0], high: float = BETA_RANGE[1]
) -> np.ndarray:
    """K log-spaced betas in [low, high], largest first, followed by beta = inf (K + 1 values)."""
    check_scalar(k, "the beta grid's size k (candidates)", int, min_val=1)
    if not 0 < low <= high:
        raise InputError(f"beta range must satisfy 0 < low <= high; got [{low}, {high}]")
    return np.concatenate([np.geomspace(high, low, k), [np.inf]])


def is_binary(ref_rewards: Array) -> bool:
    """True when every observed (non-NaN) reward is exactly 0 or 1."""
    xp = array_namespace(ref_rewards)
    seen = ~xp.isnan(ref_rewards)
    return bool(xp.all(~seen | (ref_rewards == 0) | (ref_rewards == 1)))


def _as_betas(beta: Any, like: Array) -> tuple[Array, bool]:
    """Betas as a 1-d array in ``like``'s namespace, and whether a scalar was given."""
    scalar = np.ndim(beta) == 0
    arr = np.atleast_1d(to_numpy(beta, dtype=np.float64))
    if arr.size == 0:
        raise InputError("the beta grid is empty; give at least one beta")
    if np.any(np.isnan(arr)) or np.any(arr <= 0):
        raise InputError(
            f"betas must be positive (inf allowed); got {arr[(arr <= 0) | np.isnan(arr)][:3]}"
        )
    return asarray_like(arr, like), scalar


def _check_cache(ref_rewards: Array) -> None:
    xp = array_namespace(ref_rewards)
    if ref_rewards.ndim != 2:
        raise InputError(
            f"ref_rewards must be (prompts, samples); got shape {tuple(ref_rewards.shape)}"
        )
    if bool(xp.any(xp.isinf(ref_rewards))):
        raise InputError("ref_rewards contain infinite values; mark missing samples with NaN")


def _binary_moments(ref_rewards: Array, betas: Array, prior: float) -> tuple[Array, Array]:
    """Smoothed rate p, then V = sigmoid(logit p + 1/beta) for each beta: (K, P) each."""
    xp = array_namespace(ref_rewards)
    seen = ~xp.isnan(ref_rewards)
    k = xp.sum(xp.where(seen, ref_rewards, 0.0), axis=1)
    n = xp.sum(xp.astype(seen, ref_rewards.dtype), axis=1)
    p = (k + prior) / (n + 2 * prior)
    with np.errstate(divide="ignore"):  # p = 0 or 1 (prior 0) gives logit -inf / +inf on purpose
        logit = xp.log(p) - xp.log1p(-p)
    v = sigmoid(logit[None, :] + 1.0 / betas[:, None])
    return v, v * (1 - v)


def sigmoid(z: Array) -> Array:
    """The logistic function as exp(-softplus(-z)), exact at z = +-inf (p = 1 or 0 with
    prior 0) and without overflow; any array-API array."""
    xp = array_namespace(z)
    return xp.exp(-xp.logaddexp(xp.zeros_like(z), -z))


def _continuous_moments(ref_rewards: Array, betas: Array) -> tuple[Array, Array]:
    """Self-normalised tilt weights w_m ∝ exp(r_m / beta) by log-sum-exp: (K, P) each."""
    xp = array_namespace(ref_rewards)
    seen = ~xp.isnan(ref_rewards)
    if bool(xp.any(~xp.any(seen, axis=1))):
        raise InputError(
            "a prompt has no cached reference rewards (all NaN); drop it or add samples"
        )
    r = xp.where(seen, ref_rewards, 0.0)[None, :, :]
    z = xp.where(seen[None, :, :], r / betas[:, None, None], -math.inf)
    z = z - xp.max(z, axis=2, keepdims=True)
    w = xp.exp(z)
    w = w / xp.sum(w, axis=2, keepdims=True)
    v = xp.sum(w * r, axis=2)
    var = xp.sum(w * (r - v[:, :, None]) ** 2, axis=2)
    return v, var


def tilted_moments(
    ref_rewards: Array, beta: Any, prior: float = DEFAULT_PRIOR, binary: bool | None = None
) -> tuple[Array, Array]:
    """Offline value V^_beta and reward variance for each prompt and beta.

    ref_rewards: (P, n) cached reference rewards, NaN for a missing sample. beta: a scalar
    or K values (inf allowed). Returns (values, variances), each (P,) or (K, P). Binary
    rewards (auto-detected unless ``binary`` is given) use the smoothed closed form with
    variance V(1 - V); continuous rewards use the plug-in with the tilted variance
    sum_m w_m (r_m - V)^2. ``prior`` is ignored for continuous rewards.
    """
    _check_cache(ref_rewards)
    check_scalar(prior, "prior", float, min_val=0)
    betas, scalar = _as_betas(beta, ref_rewards)
    use_binary = is_binary(ref_rewards) if binary is None else binary
    v, var = (
        _binary_moments(ref_rewards, betas, prior)
        if use_binary
        else _continuous_moments(ref_rewards, betas)
    )
    return (v[0], var[0]) if scalar else (v, var)


def tilted_value(
    ref_rewards: Array, beta: Any, prior: float = DEFAULT_PRIOR, binary: bool | None = None
) -> Array:
    """V^_beta = sum_m r_m e^{r_m/beta} / sum_m e^{r_m/beta} per prompt: (P,) or (K, P).

    See :func:`tilted_moments`, which also returns the matching reward variance.
    """
    return tilted_moments(ref_rewards, beta, prior=prior, binary=binary)[0]
