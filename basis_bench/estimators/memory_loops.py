"""``basis_memory``'s and ``basis_context``'s inner loops, compiled with numba: what numpy
would run as a dozen passes over arrays of candidates, one pass here, element by element.

Each loop does the floating point operations of the numpy expression it replaces, in the
same order (numba contracts no multiply-add and reorders no sum), so the numbers are the
numpy ones bit for bit. The exponentials stay in numpy (its vectorised ``exp`` is several
times libm's speed): the loops take them as arguments. Imported on first use: ``import
numba`` costs a fraction of a second, and ``cache=True`` keeps the compiled loops on disk
beside this file (numba's user cache directory where that is not writable).
(:mod:`basis_bench.estimators.loops` keeps ``basis_track``'s.)
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
    factors: tuple[float, ...],
    moved: np.ndarray,
    unmoved: np.ndarray,
    r: np.ndarray,
    squared: bool,
    pred: np.ndarray,
    total: np.ndarray,
) -> None:
    """Every candidate's prediction pred (S, B, C) and, if ``squared``, the batch's loss per
    candidate total (S, C) = sum_i (r_i - pred_ic)^2, summed prompt after prompt (from 0:
    0 + x is x).

    b = (m v_k + s_g) / (m + n_g) for the candidates (k, g, m, d) in C order, served as
    1 / ((1 - b) / b x factors[d] + 1) = sigmoid(logit b + delta_d) (factors e^-delta, a
    tuple: its length is a constant of the compiled loop, which unrolls the D shifts of each
    b and vectorises across them; an empty tuple: b itself); with ``moved`` (S, B) of
    e^-shift (an empty first axis: none), the grid's second copy 1 / ((1 - p) e^-shift / p +
    1) of each first-copy p, p itself where ``unmoved`` (S, B: the shift is 0). v (K, S, B);
    s, n (S, Gm, B); r (S, B). Each formula is one loop over a prompt's candidates that
    writes each prediction once and adds its loss while it is in a register."""
    n_k, n_s, n_b = v.shape
    n_q = s.shape[1] * weights.size
    half = n_k * n_q * max(len(factors), 1)
    wq, sq, dq, post = np.empty(n_q), np.empty(n_q), np.empty(n_q), np.empty(n_k * n_q)
    for a in range(n_s):
        if squared:
            total[a] = 0.0
        for i in range(n_b):
            row, ri = pred[a, i], r[a, i]
            _operands(s[a, :, i], n[a, :, i], weights, wq, sq, dq)
            for k in range(n_k):
                _posterior(wq, sq, dq, v[k, a, i], post[k * n_q : (k + 1) * n_q])
            if len(factors) == 0:
                row[:half] = post
                if squared:
                    _add_squared(ri, row[:half], total[a, :half])
            else:
                _inverse_odds(post)
                _shifted(post, factors, row[:half], ri, total[a, :half], squared)
            if moved.shape[0] and unmoved[a, i]:
                row[half:] = row[:half]
                if squared:
                    _add_squared(ri, row[half:], total[a, half:])
            elif moved.shape[0]:
                _moved(row[:half], moved[a, i], row[half:], ri, total[a, half:], squared)


@njit(error_model="numpy")
def _operands(
    s: np.ndarray, n: np.ndarray, weights: np.ndarray, wq: np.ndarray, sq: np.ndarray,
    dq: np.ndarray,
) -> None:  # fmt: skip
    """m, s_g and m + n_g at every (g, m) in C order: what b needs besides v_k."""
    q = 0
    for g in range(s.size):
        for m in range(weights.size):
            wq[q], sq[q], dq[q] = weights[m], s[g], weights[m] + n[g]
            q += 1


@njit(error_model="numpy")
def _posterior(wq: np.ndarray, sq: np.ndarray, dq: np.ndarray, vk: float, out: np.ndarray) -> None:
    """b = (m v_k + s_g) / (m + n_g) over (g, m), for one v_k."""
    for q in range(out.size):
        out[q] = (wq[q] * vk + sq[q]) / dq[q]


@njit(error_model="numpy")
def _inverse_odds(x: np.ndarray) -> None:
    for c in range(x.size):
        x[c] = (1.0 - x[c]) / x[c]


@njit(error_model="numpy")
def _shifted(
    odds: np.ndarray, factors: tuple[float, ...], out: np.ndarray, r: float, total: np.ndarray,
    squared: bool,
) -> None:  # fmt: skip
    n_d = len(factors)
    if squared:
        for j in range(odds.size):
            for d in range(n_d):
                x = 1.0 / (odds[j] * factors[d] + 1.0)
                out[j * n_d + d] = x
                total[j * n_d + d] += (r - x) * (r - x)
    else:
        for j in range(odds.size):
            for d in range(n_d):
                out[j * n_d + d] = 1.0 / (odds[j] * factors[d] + 1.0)


@njit(error_model="numpy")
def _moved(
    p: np.ndarray, f: float, out: np.ndarray, r: float, total: np.ndarray, squared: bool
) -> None:
    if squared:
        for c in range(out.size):
            x = 1.0 / ((1.0 - p[c]) * f / p[c] + 1.0)
            out[c] = x
            total[c] += (r - x) * (r - x)
    else:
        for c in range(out.size):
            out[c] = 1.0 / ((1.0 - p[c]) * f / p[c] + 1.0)


@njit(error_model="numpy")
def _add_squared(r: float, p: np.ndarray, total: np.ndarray) -> None:
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
