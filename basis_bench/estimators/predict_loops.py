"""``basis_track``'s predictions, row by row, compiled with numba: each filter's predictive
of its prompt's reward before the visit, from the posterior read from the state by index
(the probit approximation, :func:`track_predict`), and the posterior's first two moments.
The drift and the update, which move the same rows, are :mod:`loops`'; this file borrows
its helper decorator and its prefetch (:func:`loops._prefetch_row`: a hint, no number
changes with it), and takes its vector operations from :mod:`lanes` (after a change there,
touch this file: numba's disk cache knows a compiled loop's own file only).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from basis_bench.estimators.lanes import (
    LANES,
    _fma,
    _load,
    _plus,
    _reciprocal,
    _splat_at,
    _store,
    _zero,
)
from basis_bench.estimators.loops import AHEAD, _helper, _prefetch_row


def track_predict(
    weights: np.ndarray, rows: np.ndarray, order: np.ndarray, moved: np.ndarray,
    var: np.ndarray, jump: np.ndarray, theta: np.ndarray, jump_var: float, p: np.ndarray,
    moments: np.ndarray,
) -> None:  # fmt: skip
    """Each row's prediction p[order[k]] = sum_g w_g sigmoid((theta_g + moved_k) / sqrt(1 +
    pi var_k / 8)), w = weights[rows[k]] (the probit approximation of the predictive; the
    rows in the loops' order, :mod:`track_loops`); a row with jump_k != 0 mixed, (1 - jump)
    p + jump x the same at var + jump_var; and each row's moments (N, 2) sum_g w_g theta_g
    and sum_g w_g theta_g^2, at k: one pass over the row for all of them (:func:`_sums`).
    The rows' scales 1 / sqrt(1 + pi v / 8) (v = var, var + jump_var) and the exponentials
    that start the sigmoids' running products (:func:`_exps`) come first, for every row:
    the scales in a loop on vectors (:func:`_exp_arguments`), the exponentials in one numpy
    call. In the row loop they were a chain of a square root, a division and two calls of
    the C library's exp, each waiting on the last: a third of the loop's time."""
    scale, ends = np.empty((2, rows.size)), np.empty((4, rows.size))
    _exp_arguments(moved, var, theta, jump_var, scale, ends)
    with np.errstate(over="ignore"):  # an end past e^700 is made cell by cell (_exps)
        np.exp(ends, out=ends)
    _predict_rows(weights, rows, order, moved, scale, ends, jump, theta, p, moments)


@njit(cache=True, error_model="numpy")
def _exp_arguments(
    moved: np.ndarray, var: np.ndarray, theta: np.ndarray, jump_var: float, scale: np.ndarray,
    ends: np.ndarray,
) -> None:  # fmt: skip
    """Each row's scales (2, N) 1 / sqrt(1 + pi v / 8) at v = var, var + jump_var, and the
    arguments ends (4, N) of e^-z_0 = e^((-theta_0 - moved) scale) at each, then of
    e^(-spacing scale) at each (a loop on vectors)."""
    first, step = -theta[0], -(theta[1] - theta[0])
    for k in range(var.size):
        scale[0, k] = 1.0 / np.sqrt(1.0 + np.pi * var[k] / 8.0)
        scale[1, k] = 1.0 / np.sqrt(1.0 + np.pi * (var[k] + jump_var) / 8.0)
    for i in range(2):
        for k in range(var.size):
            ends[i, k] = (first - moved[k]) * scale[i, k]
            ends[2 + i, k] = step * scale[i, k]


@njit(cache=True, error_model="numpy")
def _predict_rows(
    weights: np.ndarray, rows: np.ndarray, order: np.ndarray, moved: np.ndarray,
    scale: np.ndarray, ends: np.ndarray, jump: np.ndarray, theta: np.ndarray, p: np.ndarray,
    moments: np.ndarray,
) -> None:  # fmt: skip
    """:func:`track_predict`'s loop over the rows, with its scales (2, N) and exponentials
    ends (4, N): e^-z_0 at each scale, then e^-spacing scale at each."""
    g_n = theta.size
    ez, ez_jump, square, sums = np.empty(g_n), np.empty(g_n), theta * theta, np.empty(4)
    for n in range(min(AHEAD, rows.size)):
        _prefetch_row(weights, rows, n)
    for k in range(rows.size):
        _prefetch_row(weights, rows, k + AHEAD)
        _sigmoids(ez, _exps(theta, moved[k], scale[0, k], ends[0, k], ends[2, k], ez))
        jumps = jump[k] != 0.0
        if jumps:
            finite = _exps(theta, moved[k], scale[1, k], ends[1, k], ends[3, k], ez_jump)
            _sigmoids(ez_jump, finite)
        _sums(weights, rows[k], ez, ez_jump, jumps, theta, square, sums)
        p[order[k]] = (1.0 - jump[k]) * sums[0] + jump[k] * sums[3] if jumps else sums[0]
        moments[k, 0], moments[k, 1] = sums[1], sums[2]


@_helper()
def _exps(
    theta: np.ndarray, shift: float, scale: float, e0: float, s1: float, ez: np.ndarray
) -> bool:
    """ez_g = e^-z_g, z_g = (theta_g + shift) scale, on an evenly spaced grid, from e0 =
    e^-z_0 and s1 = e^(-spacing scale): e0 s^g; s^g for g < 8 a product of s, s^2 and s^4 (no
    chain of 7 products waiting on each other), and each cell from 8 on the one 8 before
    times s^8, on vectors of LANES = 8 cells where G is a multiple of 8 (s^8's roundings
    compound over the steps: the last of 64 cells within some 130 units in the last place,
    3e-14 relative, of its exponential); each cell's own exponential where the ends leave
    e^+-700 (no product near overflow). Returns whether the cells are the running product's
    (all below e^700, none infinite)."""
    g_n = ez.size
    first, last = (-theta[0] - shift) * scale, (-theta[-1] - shift) * scale
    if not (-700.0 < last and first < 700.0) or g_n < 8:
        for g in range(g_n):
            ez[g] = np.exp((-theta[g] - shift) * scale)
        return False
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
        return True
    ez[LANES] = s8  # read back in every lane, then overwritten
    factor, cells, nothing = _splat_at(ez, LANES), _load(ez, 0), _zero()
    for g in range(LANES, g_n, LANES):
        cells = _fma(cells, factor, nothing)  # cells s^8 + 0: the product, one rounding
        _store(ez, g, cells)
    return True


@_helper()
def _sigmoids(ez: np.ndarray, finite: bool) -> None:
    """ez_g <- sigmoid(z_g) = 1 / (1 + ez_g), in place, a vector of LANES at a time
    (:func:`_reciprocal`) where G is a multiple of LANES and every ez_g is ``finite``
    (:func:`_exps`; 1 / inf is 0, the estimate's Newton step would make it NaN)."""
    if ez.size % LANES or not finite:
        for g in range(ez.size):
            ez[g] = 1.0 / (1.0 + ez[g])
        return
    for g in range(0, ez.size, LANES):
        _store(ez, g, _reciprocal(_plus(_load(ez, g), 1.0)))


@_helper(fastmath={"reassoc"})
def _sums(
    weights: np.ndarray, i: int, ez: np.ndarray, ez_jump: np.ndarray, jumps: bool,
    theta: np.ndarray, square: np.ndarray, sums: np.ndarray,
) -> None:  # fmt: skip
    """sums = (sum_g w_g sigmoid(z_g), sum_g w_g theta_g, sum_g w_g theta_g^2, and if
    ``jumps`` sum_g w_g sigmoid(z'_g)), w = weights[i], the sigmoids ez, ez_jump
    (:func:`_sigmoids`): one read of the row, the sums on vectors."""
    p = p_jump = m1 = m2 = 0.0
    if jumps:
        for g in range(theta.size):
            w = weights[i, g]
            p += w * ez[g]
            p_jump += w * ez_jump[g]
            m1 += w * theta[g]
            m2 += w * square[g]
    else:
        for g in range(theta.size):
            w = weights[i, g]
            p += w * ez[g]
            m1 += w * theta[g]
            m2 += w * square[g]
    sums[0], sums[1], sums[2], sums[3] = p, m1, m2, p_jump
