"""``basis_memory``'s and ``basis_context``'s inner loops, compiled with numba: what numpy
would run as a dozen passes over arrays of candidates, one pass here, element by element.

Each loop does the floating point operations of the numpy expression it replaces, in the
same order (numba contracts no multiply-add and reorders no sum), so the numbers are the
numpy ones bit for bit. The exponentials stay in numpy (its vectorised ``exp`` is several
times libm's speed): the loops take them as arguments. Imported on first use: ``import
numba`` costs a fraction of a second, and ``cache=True`` keeps the compiled loops on disk
beside this file (numba's user cache directory where that is not writable). (Moved here
from :mod:`basis_bench.estimators.loops`, unchanged, which keeps ``basis_track``'s.)
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, error_model="numpy")
def memory_predictions(
    v: np.ndarray,
    s: np.ndarray,
    n: np.ndarray,
    weights: np.ndarray,
    factors: np.ndarray,
    moved: np.ndarray,
    unmoved: np.ndarray,
    r: np.ndarray,
    squared: bool,
    pred: np.ndarray,
    total: np.ndarray,
) -> None:
    """Every candidate's prediction pred (S, B, C) and, if ``squared``, the batch's loss per
    candidate total (S, C) = sum_i (r_i - pred_ic)^2, summed prompt after prompt.

    b = (m v_k + s_g) / (m + n_g) for the candidates (k, g, m, d) in C order, served as
    1 / ((1 - b) / b x factors[d] + 1) = sigmoid(logit b + delta_d) (factors e^-delta; an
    empty ``factors``: b itself); with ``moved`` (S, B) of e^-shift (an empty first axis:
    none), the grid's second copy 1 / ((1 - p) e^-shift / p + 1) of each first-copy p, p
    itself where ``unmoved`` (S, B: the shift is 0). v (K, S, B); s, n (S, Gm, B); r (S, B).
    Each formula runs as one loop over a prompt's candidates (operands repeated to their
    length first), which the compiler vectorises: elementwise, the same numbers."""
    n_k, n_s, n_b = v.shape
    n_g, n_m, n_d = s.shape[1], weights.size, max(factors.size, 1)
    n_post = n_k * n_g * n_m
    half = n_post * n_d
    numer_w, vk, add = np.empty(n_post), np.empty(n_post), np.empty(n_post)
    denom, post = np.empty(n_post), np.empty(n_post)
    odds, factor, second = np.empty(half), np.empty(half), np.empty(half)
    for j in range(n_post):
        numer_w[j] = weights[j % n_m]
    for c in range(half if factors.size else 0):
        factor[c] = factors[c % n_d]
    for a in range(n_s):
        for i in range(n_b):
            row = pred[a, i]
            _operands(v[:, a, i], s[a, :, i], n[a, :, i], weights, vk, add, denom)
            _posterior(numer_w, vk, add, denom, post)
            if factors.size == 0:
                row[:half] = post
            else:
                _inverse_odds(post)
                _repeat(post, n_d, odds)
                _shifted(odds, factor, row[:half])
            if moved.shape[0]:
                if unmoved[a, i]:
                    row[half:] = row[:half]
                else:
                    second[:] = row[:half]
                    _moved(second, moved[a, i], row[half:])
            if squared:
                _add_squared(r[a, i], row, total[a], i == 0)


@njit(error_model="numpy")
def _operands(
    v: np.ndarray, s: np.ndarray, n: np.ndarray, weights: np.ndarray, vk: np.ndarray,
    add: np.ndarray, denom: np.ndarray,
) -> None:  # fmt: skip
    """v_k, s_g and m + n_g at every (k, g, m) in C order."""
    j = 0
    for k in range(v.size):
        for g in range(s.size):
            for m in range(weights.size):
                vk[j], add[j], denom[j] = v[k], s[g], weights[m] + n[g]
                j += 1


@njit(error_model="numpy")
def _repeat(x: np.ndarray, times: int, out: np.ndarray) -> None:
    c = 0
    for j in range(x.size):
        for _ in range(times):
            out[c] = x[j]
            c += 1


@njit(error_model="numpy")
def _posterior(w: np.ndarray, v: np.ndarray, s: np.ndarray, d: np.ndarray, out: np.ndarray) -> None:
    for j in range(out.size):
        out[j] = (w[j] * v[j] + s[j]) / d[j]


@njit(error_model="numpy")
def _inverse_odds(x: np.ndarray) -> None:
    for c in range(x.size):
        x[c] = (1.0 - x[c]) / x[c]


@njit(error_model="numpy")
def _shifted(odds: np.ndarray, factor: np.ndarray, out: np.ndarray) -> None:
    for c in range(out.size):
        out[c] = 1.0 / (odds[c] * factor[c] + 1.0)


@njit(error_model="numpy")
def _moved(p: np.ndarray, f: float, out: np.ndarray) -> None:
    for c in range(out.size):
        out[c] = 1.0 / ((1.0 - p[c]) * f / p[c] + 1.0)


@njit(error_model="numpy")
def _add_squared(r: float, p: np.ndarray, total: np.ndarray, first: bool) -> None:
    if first:
        for c in range(p.size):
            total[c] = (r - p[c]) * (r - p[c])
    else:
        for c in range(p.size):
            total[c] += (r - p[c]) * (r - p[c])


@njit(cache=True, error_model="numpy")
def memory_choice(
    pred: np.ndarray,
    loss: np.ndarray,
    r: np.ndarray,
    past: np.ndarray,
    loo: bool,
    total: np.ndarray,
    worst: np.ndarray,
    choice: np.ndarray,
    values: np.ndarray,
) -> None:
    """Each prompt's choice (S, B), argmin_c of score_c - loss_ic (``loo``) or of score_c,
    the first on ties, score = total + past (an empty ``past``: total), and its value
    pred[., i, choice] (S, B); loss (S, B, C) as given, or (an empty ``loss``) the squared
    loss (r_i - pred_ic)^2; worst (S,): a bound on each stream's losses.

    Leave-one-out, only a candidate with score_c - worst <= min(score) can win (any other
    has score_c - loss_ic >= score_c - worst > min(score) >= score_c* - loss_ic* at c* =
    argmin score, and rounding keeps these orders): those are compared, in order."""
    n_s, n_b, n_c = pred.shape
    score = np.empty(n_c)
    keep = np.empty(n_c, dtype=np.intp)
    none = np.empty(0)
    for a in range(n_s):
        for c in range(n_c):
            score[c] = total[a, c] + past[a, c] if past.shape[0] else total[a, c]
        best = np.argmin(score)  # the first minimum
        if not loo:
            choice[a] = best
            for i in range(n_b):
                values[a, i] = pred[a, i, best]
            continue
        kept = 0
        for c in range(n_c):
            if score[c] - worst[a] <= score[best]:
                keep[kept] = c
                kept += 1
        for i in range(n_b):
            own = loss[a, i] if loss.shape[0] else none
            choice[a, i] = _first_min(score, keep[:kept], own, r[a, i], pred[a, i])
            values[a, i] = pred[a, i, choice[a, i]]


@njit(error_model="numpy")
def _first_min(
    score: np.ndarray, keep: np.ndarray, loss: np.ndarray, r: float, pred: np.ndarray
) -> int:
    """argmin of score_c - loss_c over the candidates ``keep``, the first on ties; the loss
    as given, or (an empty ``loss``) the squared loss (r - pred_c)^2."""
    arg, low = -1, np.inf
    for c in keep:
        x = score[c] - loss[c] if loss.size else score[c] - (r - pred[c]) * (r - pred[c])
        if arg < 0 or x < low:
            arg, low = c, x
    return arg
