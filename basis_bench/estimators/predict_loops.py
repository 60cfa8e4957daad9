"""``basis_track``'s predictions, row by row, compiled with numba: each filter's predictive
of its prompt's reward before the visit, from the posterior read from the state by index
(the probit approximation, :func:`track_predict`), and the posterior's first two moments.
The drift and the update, which move the same rows, are :mod:`loops`'; this file borrows
its prefetch (:func:`loops._prefetch_row`: a hint, no number changes with it; numba's disk
cache knows a compiled loop's own file only) and its helper decorator.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from basis_bench.estimators.loops import AHEAD, _helper, _prefetch_row


@njit(cache=True, error_model="numpy")
def track_predict(
    weights: np.ndarray,
    rows: np.ndarray,
    moved: np.ndarray,
    var: np.ndarray,
    jump: np.ndarray,
    theta: np.ndarray,
    jump_var: float,
    p: np.ndarray,
    moments: np.ndarray,
) -> None:
    """Each row's prediction p (N,) = sum_g w_g sigmoid((theta_g + moved) / sqrt(1 + pi var
    / 8)), w = weights[rows[n]] (the probit approximation of the predictive); a row with
    jump != 0 mixed, (1 - jump) p + jump x the same at var + jump_var; and each row's
    moments (N, 2) sum_g w_g theta_g and sum_g w_g theta_g^2."""
    g_n = theta.size
    ez, square = np.empty(g_n), theta * theta
    for n in range(min(AHEAD, rows.size)):
        _prefetch_row(weights, rows, n)
    for n in range(rows.size):
        _prefetch_row(weights, rows, n + AHEAD)
        i = rows[n]
        _exps(theta, moved[n], var[n], ez)
        pn = _predictive(weights, i, ez)
        if jump[n] != 0.0:
            _exps(theta, moved[n], var[n] + jump_var, ez)
            pn = (1.0 - jump[n]) * pn + jump[n] * _predictive(weights, i, ez)
        p[n] = pn
        moments[n, 0], moments[n, 1] = _row_dot(weights, i, theta), _row_dot(weights, i, square)


@_helper()
def _exps(theta: np.ndarray, shift: float, var: float, ez: np.ndarray) -> None:
    """ez_g = e^-z_g, z_g = (theta_g + shift) / sqrt(1 + pi var / 8), on an evenly spaced
    grid: a running product, e^-z_0 times e^(-spacing scale) g times for the first 8 cells
    and each cell the one 8 before times its 8th power (some 17 roundings at most, the
    product vectorised by 8); each cell's own exponential where the ends leave e^+-700 (no
    product near overflow)."""
    scale = 1.0 / np.sqrt(1.0 + np.pi * var / 8.0)
    first, last = (-theta[0] - shift) * scale, (-theta[-1] - shift) * scale
    if -700.0 < last and first < 700.0:
        step = np.exp(-(theta[1] - theta[0]) * scale)
        ez[0] = np.exp(first)
        for g in range(1, min(8, ez.size)):
            ez[g] = ez[g - 1] * step
        step2 = step * step
        step4 = step2 * step2
        step8 = step4 * step4
        for g in range(8, ez.size):
            ez[g] = ez[g - 8] * step8
    else:
        for g in range(ez.size):
            ez[g] = np.exp((-theta[g] - shift) * scale)


@_helper(fastmath={"reassoc"})
def _predictive(weights: np.ndarray, i: int, ez: np.ndarray) -> float:
    """sum_g weights[i, g] sigmoid(z_g), sigmoid(z_g) = 1 / (1 + ez_g) (:func:`_exps`)."""
    acc = 0.0
    for g in range(ez.size):
        acc += weights[i, g] * (1.0 / (1.0 + ez[g]))
    return acc


@_helper(fastmath={"reassoc"})
def _row_dot(weights: np.ndarray, i: int, y: np.ndarray) -> float:
    """weights[i] . y (a row by index, not a view: see :mod:`loops`)."""
    acc = 0.0
    for g in range(y.size):
        acc += weights[i, g] * y[g]
    return acc
