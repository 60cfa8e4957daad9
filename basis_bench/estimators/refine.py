"""Step 2 of BASIS: batchwise leave-one-out refinement with BLUE weights (Proposition 1).

Estimate V_i from the OTHER prompts' single rewards, V~_i = sum_{j != i} w_ij r_j. Asking
for unbiasedness (sum_j w_ij V_j = V_i) at minimal variance (sum_j w_ij^2 sigma_j^2), a
Lagrange multiplier gives w_ij = V_i (V_j / sigma_j^2) / sum_{k != i} V_k^2 / sigma_k^2.
With the offline V^ and s^2 plugged in, and a_j = V^_j / s^2_j on the active set
A = {j : s^2_j > eps}:

    unb:  V~_i = V^_i * S1_i / S2_i,        S1_i = sum_{j in A, j != i} a_j r_j
    vop:  V~_i = V^_i * S1_i / (1 + S2_i)   S2_i = sum_{j in A, j != i} a_j V^_j
    rvg:  V~_i = V^_i * mean_{j in A, j != i} r_j / V^_j

Each leave-one-out sum is the batch total minus prompt i's own term: O(B) per batch.
Where A minus i is empty or S2_i is not positive, V~_i falls back to V^_i.
"""

from __future__ import annotations

import math
from typing import Any

from array_api_compat import array_namespace

from basis_bench.estimators._array import (
    Array,
    RewardRange,
    check_choice,
    check_rewards,
    check_same_shape,
)
from basis_bench.estimators.options import DEFAULT_EPS, DEFAULT_THRESHOLD, RATIO_VARS, VARIANTS
from basis_bench.settings import check_scalar

__all__ = ["RATIO_VARS", "VARIANTS", "Z_95", "refine"]
Z_95 = 1.959963984540054
"""The normal 97.5% quantile: the t inflation here, and every 95% interval the package reports."""


def _loo(terms: Array) -> Array:
    """Leave-one-out sums over the last axis: total minus each element's own term."""
    xp = array_namespace(terms)
    return xp.sum(terms, axis=-1, keepdims=True) - terms


def _shrink_to_one(ratio: Array, ratio_var: Array) -> Array:
    """Positive-part James-Stein shrinkage of a ratio towards 1.

    R* = 1 + (1 - Var(R) / (R - 1)^2)_+ (R - 1): the ratio keeps only the part of its
    departure from 1 that exceeds its own noise.
    """
    xp = array_namespace(ratio)
    dev = ratio - 1
    dev2 = dev * dev
    keep = xp.where(dev2 > 0, xp.clip(1 - ratio_var / xp.where(dev2 > 0, dev2, 1.0), 0.0, 1.0), 0.0)
    return 1 + keep * dev


def refine(
    v_init: Array,
    rewards: Array,
    variant: str = "unb",
    eps: float = DEFAULT_EPS,
    reward_var: Array | None = None,
    shrink: bool = False,
    clip: tuple[float, float] | None = None,
    reward_range: RewardRange = (0.0, 1.0),
    ratio_var: str = "robust",
    threshold: float = DEFAULT_THRESHOLD,
) -> Array:
    """Refined values V~ of shape (..., B) from initial values and one reward per prompt.

    v_init, rewards: (..., B); reward_var: the sources' reward variances s^2 (default
    V(1 - V), the binary case). ``shrink`` pulls the calibration ratio towards 1 by its
    estimated variance, an option for small batches where the ratio itself is noisy;
    ``ratio_var`` says which variance: ``model`` (the tilt model's own, 1/S2 for unb,
    sum s^2_j / V_j^2 / m^2 for rvg) or ``robust`` (the larger of that and the leave-one-out
    sandwich estimate from the observed residuals; see docs/method.md, "A robust default"),
    and ``threshold`` c the multiple of it that the ratio's squared departure from 1 must
    exceed: R* = 1 + (1 - c Var R / (R - 1)^2)_+ (R - 1) (c = 1: positive-part James-Stein).
    ``clip`` clips V~ to a range (off by default: the BLUE is unbiased and may leave [0, 1]).

    This function's default is the paper's estimator (no shrinkage); the registered
    ``basis`` estimator (and :class:`BasisOptions`) default to ``shrink=True``.
    """
    check_choice(variant, VARIANTS, "refinement variant")
    check_choice(ratio_var, RATIO_VARS, "ratio variance")
    check_same_shape(v_init, rewards, "v_init and rewards")
    check_rewards(rewards, reward_range)
    var = v_init * (1 - v_init) if reward_var is None else reward_var
    check_same_shape(v_init, var, "v_init and reward_var")
    check_scalar(threshold, "threshold", float, min_val=0)
    return _refine(v_init, rewards, variant, eps, var, shrink, clip, ratio_var, threshold)


def _sandwich(xp: Any, terms: tuple[Array, Array, Array], ratio: Array, m: Array) -> Array:
    """Leave-one-out sandwich variance of a ratio estimator, from its residuals.

    For R_i = sum_{j != i} c_j y_j / sum_{j != i} c_j x_j (rvg: c_j = 1, x_j = 1), the
    linearised variance is sum_{j != i} c_j^2 (y_j - R_i x_j)^2 / (sum_{j != i} c_j x_j)^2,
    times m/(m - 1) for the one degree of freedom R_i spent. ``terms`` are the per-source
    c^2 y^2, c^2 x y and c^2 x^2; expanding the square turns each into one leave-one-out sum,
    so this stays O(B). Where m <= 1 there is no residual to learn from: +inf (no trust).
    """
    yy, xy, xx = (_loo(t) for t in terms)
    resid = xp.clip(yy - 2 * ratio * xy + ratio * ratio * xx, 0.0, None)
    ok = m > 1
    return xp.where(ok, resid * m / xp.where(ok, m - 1, 1.0), math.inf)


def _leverage_factor(xp: Any, weight: Array) -> Array:
    """(1 - h_j)^2 with h_j = weight_j / sum_k weight_k, each source's leverage on the ratio.

    Dividing a squared residual by it (HC3, the jackknife's first order) undoes the part of
    it the ratio absorbed by fitting that source; a source with h_j near 1 (it carries the
    ratio alone) gets a huge variance, so the ratio is not trusted. h uses the whole
    batch's total, not the leave-one-out one, to stay O(B); h is capped at 0.99.
    """
    total = xp.sum(weight, axis=-1, keepdims=True)
    h = xp.clip(weight / xp.where(total > 0, total, 1.0), 0.0, 0.99)
    return (1 - h) * (1 - h)


def _t_inflation(xp: Any, weight: Array, total: Array) -> Array:
    """(t_{0.975, nu} / z_{0.975})^2 with nu = n_eff - 1 degrees of freedom, n_eff the Kish
    effective number of sources of the leave-one-out ratio, (sum w)^2 / sum w^2.

    A variance estimated from few (or few dominant) residuals is itself noisy; testing the
    ratio's departure against it calls for Student's t, not the normal quantile. The t
    quantile is the Cornish-Fisher expansion in 1/nu (exact to O(nu^-3); nu >= 1 enforced).
    """
    n_eff = total * total / xp.where(_loo(weight * weight) > 0, _loo(weight * weight), 1.0)
    nu = xp.clip(n_eff - 1, 1.0, None)
    z = Z_95
    t = z + (z**3 + z) / (4 * nu) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * nu * nu)
    return (t / z) ** 2


def _refine(
    v_init: Array,
    rewards: Array,
    variant: str,
    eps: float,
    var: Array,
    shrink: bool = False,
    clip: tuple[float, float] | None = None,
    ratio_var: str = "model",
    threshold: float = 1.0,
) -> Array:
    """The kernel of :func:`refine`: inputs already checked, ``var`` given."""
    xp = array_namespace(v_init, rewards)
    active = var > eps
    safe_var = xp.where(active, var, 1.0)
    n_others = _loo(xp.astype(active, v_init.dtype))

    if variant == "rvg":
        safe_v = xp.where(active, v_init, 1.0)
        ok = active & (v_init != 0)
        ratio_terms = xp.where(ok, rewards / safe_v, 0.0)
        m = _loo(xp.astype(ok, v_init.dtype))
        has = m > 0
        m_safe = xp.where(has, m, 1.0)
        ratio = _loo(ratio_terms) / m_safe
        if shrink:
            noise = xp.where(ok, safe_var / (safe_v * safe_v), 0.0)
            r_var = _loo(noise) / (m_safe * m_safe)
            if ratio_var == "robust":
                ones = xp.astype(ok, v_init.dtype)
                c2 = ones / _leverage_factor(xp, ones)
                terms = (c2 * ratio_terms * ratio_terms, c2 * ratio_terms, c2)
                r_var = xp.maximum(r_var, _sandwich(xp, terms, ratio, m) / (m_safe * m_safe))
                r_var = r_var * _t_inflation(xp, ones, m_safe)
            ratio = _shrink_to_one(ratio, threshold * r_var)
    else:
        a = xp.where(active, v_init / safe_var, 0.0)
        s1 = _loo(a * rewards)
        s2 = _loo(a * v_init)
        has = (n_others > 0) & (s2 > 0)
        s2_safe = xp.where(has, s2, 1.0)
        if variant == "unb":
            ratio = s1 / s2_safe
            if shrink:
                r_var = 1.0 / s2_safe
                if ratio_var == "robust":
                    a2 = a * a / _leverage_factor(xp, a * v_init)
                    terms = (a2 * rewards * rewards, a2 * v_init * rewards, a2 * v_init * v_init)
                    sand = _sandwich(xp, terms, ratio, n_others) / (s2_safe * s2_safe)
                    r_var = xp.maximum(r_var, sand) * _t_inflation(xp, a * v_init, s2_safe)
                ratio = _shrink_to_one(ratio, threshold * r_var)
        else:  # vop: bias^2 + variance, the 1 in the denominator shrinks towards 0
            ratio = s1 / (1 + s2)

    out = xp.where(has, v_init * ratio, v_init)
    if clip is not None:
        out = xp.clip(out, clip[0], clip[1])
    return out
