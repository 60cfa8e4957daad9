"""``basis_track``'s predictions, row by row, compiled with numba: each filter's predictive
of its prompt's reward before the visit, from the posterior read from the state by index
(the probit approximation, :func:`track_predict`), and the posterior's first two moments.
The drift and the update, which move the same rows, are :mod:`loops`'; this file borrows
its helper decorator, its prefetch (:func:`loops._prefetch_row`: a hint, no number changes
with it) and its vector intrinsics (a load, a store, a broadcast, a fused multiply-add: LLVM
instructions). An intrinsic is compiled into its caller and numba's disk cache knows a
compiled loop's own file only: after a change to them in loops.py, touch this file.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from basis_bench.estimators.loops import (
    AHEAD,
    LANES,
    _fma,
    _helper,
    _load,
    _prefetch_row,
    _splat_at,
    _store,
    _zero,
)


@njit(cache=True, error_model="numpy")
def track_predict(
    weights: np.ndarray,
    rows: np.ndarray,
    order: np.ndarray,
    moved: np.ndarray,
    var: np.ndarray,
    jump: np.ndarray,
    theta: np.ndarray,
    jump_var: float,
    p: np.ndarray,
    moments: np.ndarray,
) -> None:
    """Each row's prediction p[order[k]] = sum_g w_g sigmoid((theta_g + moved_k) / sqrt(1 +
    pi var_k / 8)), w = weights[rows[k]] (the probit approximation of the predictive; the
    rows in the loops' order, :mod:`track_loops`); a row with jump_k != 0 mixed, (1 - jump)
    p + jump x the same at var + jump_var; and each row's moments (N, 2) sum_g w_g theta_g
    and sum_g w_g theta_g^2, at k: one pass over the row for all of them (:func:`_sums`)."""
    g_n = theta.size
    ez, ez_jump, square, sums = np.empty(g_n), np.empty(g_n), theta * theta, np.empty(4)
    for n in range(min(AHEAD, rows.size)):
        _prefetch_row(weights, rows, n)
    for k in range(rows.size):
        _prefetch_row(weights, rows, k + AHEAD)
        _exps(theta, moved[k], var[k], ez)
        jumps = jump[k] != 0.0
        if jumps:
            _exps(theta, moved[k], var[k] + jump_var, ez_jump)
        _sums(weights, rows[k], ez, ez_jump, jumps, theta, square, sums)
        p[order[k]] = (1.0 - jump[k]) * sums[0] + jump[k] * sums[3] if jumps else sums[0]
        moments[k, 0], moments[k, 1] = sums[1], sums[2]


@_helper()
def _exps(theta: np.ndarray, shift: float, var: float, ez: np.ndarray) -> None:
    """ez_g = e^-z_g, z_g = (theta_g + shift) / sqrt(1 + pi var / 8), on an evenly spaced
    grid: e^-z_0 s^g, s = e^(-spacing scale); s^g for g < 8 a product of s, s^2 and s^4 (no
    chain of 7 products waiting on each other), and each cell from 8 on the one 8 before
    times s^8, on vectors of LANES = 8 cells where G is a multiple of 8 (s^8's roundings
    compound over the steps: the last of 64 cells within some 130 units in the last place,
    3e-14 relative, of its exponential); each cell's own exponential where the ends leave
    e^+-700 (no product near overflow)."""
    g_n = ez.size
    scale = 1.0 / np.sqrt(1.0 + np.pi * var / 8.0)
    first, last = (-theta[0] - shift) * scale, (-theta[-1] - shift) * scale
    if not (-700.0 < last and first < 700.0) or g_n < 8:
        for g in range(g_n):
            ez[g] = np.exp((-theta[g] - shift) * scale)
        return
    s1 = np.exp(-(theta[1] - theta[0]) * scale)
    e0 = np.exp(first)
    s2 = s1 * s1
    s4 = s2 * s2
    e2, e4 = e0 * s2, e0 * s4
    e6 = e4 * s2
    ez[0], ez[1], ez[2], ez[3] = e0, e0 * s1, e2, e2 * s1
    ez[4], ez[5], ez[6], ez[7] = e4, e4 * s1, e6, e6 * s1
    s8 = s4 * s4
    if LANES != 8 or g_n % 8 or g_n == 8:  # a vector's cells are the 8 before times s^8
        for g in range(8, g_n):
            ez[g] = ez[g - 8] * s8
        return
    ez[LANES] = s8  # read back in every lane, then overwritten
    factor, cells, nothing = _splat_at(ez, LANES), _load(ez, 0), _zero()
    for g in range(LANES, g_n, LANES):
        cells = _fma(cells, factor, nothing)  # cells s^8 + 0: the product, one rounding
        _store(ez, g, cells)


@_helper(fastmath={"reassoc"})
def _sums(
    weights: np.ndarray, i: int, ez: np.ndarray, ez_jump: np.ndarray, jumps: bool,
    theta: np.ndarray, square: np.ndarray, sums: np.ndarray,
) -> None:  # fmt: skip
    """sums = (sum_g w_g sigmoid(z_g), sum_g w_g theta_g, sum_g w_g theta_g^2, and if
    ``jumps`` sum_g w_g sigmoid(z'_g)), w = weights[i], sigmoid(z_g) = 1 / (1 + ez_g)
    (:func:`_exps`): one read of the row, the sums on vectors."""
    p = p_jump = m1 = m2 = 0.0
    if jumps:
        for g in range(theta.size):
            w = weights[i, g]
            p += w * (1.0 / (1.0 + ez[g]))
            p_jump += w * (1.0 / (1.0 + ez_jump[g]))
            m1 += w * theta[g]
            m2 += w * square[g]
    else:
        for g in range(theta.size):
            w = weights[i, g]
            p += w * (1.0 / (1.0 + ez[g]))
            m1 += w * theta[g]
            m2 += w * square[g]
    sums[0], sums[1], sums[2], sums[3] = p, m1, m2, p_jump
