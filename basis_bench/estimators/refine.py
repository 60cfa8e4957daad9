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

from array_api_compat import array_namespace

from basis_bench.estimators._array import (
    Array,
    RewardRange,
    check_choice,
    check_rewards,
    check_same_shape,
)
from basis_bench.estimators.options import DEFAULT_EPS, VARIANTS

__all__ = ["VARIANTS", "refine"]


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
) -> Array:
    """Refined values V~ of shape (..., B) from initial values and one reward per prompt.

    v_init, rewards: (..., B); reward_var: the sources' reward variances s^2 (default
    V(1 - V), the binary case). ``shrink`` pulls the calibration ratio towards 1 by its
    estimated variance (Var S1/S2 = 1/S2 for unb; sum s^2_j / V_j^2 / m^2 for rvg), an
    option for small batches where the ratio itself is noisy. ``clip`` clips V~ to a range
    (off by default: the BLUE is unbiased and may leave [0, 1]).
    """
    check_choice(variant, VARIANTS, "refinement variant")
    check_same_shape(v_init, rewards, "v_init and rewards")
    check_rewards(rewards, reward_range)
    var = v_init * (1 - v_init) if reward_var is None else reward_var
    check_same_shape(v_init, var, "v_init and reward_var")
    return _refine(v_init, rewards, variant, eps, var, shrink, clip)


def _refine(
    v_init: Array,
    rewards: Array,
    variant: str,
    eps: float,
    var: Array,
    shrink: bool = False,
    clip: tuple[float, float] | None = None,
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
            ratio = _shrink_to_one(ratio, _loo(noise) / (m_safe * m_safe))
    else:
        a = xp.where(active, v_init / safe_var, 0.0)
        s1 = _loo(a * rewards)
        s2 = _loo(a * v_init)
        has = (n_others > 0) & (s2 > 0)
        s2_safe = xp.where(has, s2, 1.0)
        if variant == "unb":
            ratio = s1 / s2_safe
            if shrink:
                ratio = _shrink_to_one(ratio, 1.0 / s2_safe)
        else:  # vop: bias^2 + variance, the 1 in the denominator shrinks towards 0
            ratio = s1 / (1 + s2)

    out = xp.where(has, v_init * ratio, v_init)
    if clip is not None:
        out = xp.clip(out, clip[0], clip[1])
    return out
