"""The stateful estimators' inner loops, compiled with numba: what numpy would run as a
dozen passes over arrays of candidates (``basis_memory``, ``basis_context``) or of posterior
rows (``basis_track``), one pass here, element by element.

Each loop does the floating point operations of the numpy expression it replaces, in the
same order (numba contracts no multiply-add and reorders no sum), so ``basis_memory``'s
and ``basis_context``'s numbers are the numpy ones bit for bit. The exponentials stay in
numpy (its vectorised ``exp`` is several times libm's speed): the loops take them as
arguments. Imported on first use: ``import numba`` costs a fraction of a second, and
``cache=True`` keeps the compiled loops on disk beside this file (numba's user cache
directory where that is not writable).
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


@njit
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


@njit
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


@njit
def _add_squared(r: float, p: np.ndarray, total: np.ndarray, first: bool) -> None:
    if first:
        for c in range(p.size):
            total[c] = (r - p[c]) * (r - p[c])
    else:
        for c in range(p.size):
            total[c] += (r - p[c]) * (r - p[c])


@njit(cache=True)
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


@njit
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


@njit(cache=True)
def track_predict(
    weights: np.ndarray,
    rows: np.ndarray,
    ez: np.ndarray,
    at: np.ndarray,
    ez_jump: np.ndarray,
    jump: np.ndarray,
    theta: np.ndarray,
    p: np.ndarray,
    moments: np.ndarray,
) -> None:
    """Each row's prediction p (N,) = sum_g w_g / (1 + ez_g), w = weights[rows[n]] (the
    sigmoid of a log-odds z as 1 / (1 + e^-z): ez = e^-z); the rows ``at`` mixed with a
    second prediction, (1 - jump) p + jump sum_g w_g / (1 + ez_jump_g); and each row's
    moments (N, 2) sum_g w_g theta_g and sum_g w_g theta_g^2."""
    g_n = theta.size
    sig, square = np.empty(g_n), theta * theta
    for n in range(rows.size):
        w = weights[rows[n]]
        _logistic(ez[n], sig)
        p[n] = _dot(w, sig)
        moments[n, 0], moments[n, 1] = _dot(w, theta), _dot(w, square)
    for j in range(at.size):
        _logistic(ez_jump[j], sig)
        p[at[j]] = (1.0 - jump[j]) * p[at[j]] + jump[j] * _dot(weights[rows[at[j]]], sig)


@njit
def _logistic(ez: np.ndarray, out: np.ndarray) -> None:
    for g in range(out.size):
        out[g] = 1.0 / (1.0 + ez[g])


@njit(cache=True)
def track_drift(
    weights: np.ndarray,
    rows: np.ndarray,
    units: np.ndarray,
    blur_at: np.ndarray,
    half: np.ndarray,
    jump_at: np.ndarray,
    jump: np.ndarray,
    redrawn: np.ndarray,
    sig: np.ndarray,
    out: np.ndarray,
    values: np.ndarray,
) -> None:
    """Each row's posterior before the visit out (N, G) and its mean value (N,) sum_g out_g
    sig_g, from w = weights[rows[n]]:

    * moved by units[n] grid steps: each cell's mass spread uniformly over the cell and
      moved, the cumulative mass (0 below the grid, the total above it) read at every cell
      edge moved back, interpolated by the move's fraction;
    * the rows ``blur_at`` blurred by a Gaussian whose densities at the offsets 0, .., G - 1
      are ``half`` (one row each): out_h = sum_g K[h, g] w_g / norm_g, K[h, g] = half[|h -
      g|], norm_g = sum_h K[h, g] as two partial sums of the densities;
    * the rows ``jump_at`` mixed with the redrawn posterior: (1 - jump) out + jump redrawn,
      redrawn (one row each) normalised here.
    """
    n_rows, g_n = out.shape
    ext = np.zeros(3 * g_n + 3)  # ext[g_n + 1 + j]: the mass below edge j, |j| <= 2 G + 1
    edges = np.empty(g_n + 1)
    for n in range(n_rows):
        total = _cumsum(weights[rows[n]], ext[g_n + 2 : 2 * g_n + 2])
        ext[2 * g_n + 2 :] = total
        back = -units[n]
        whole = np.floor(back)
        start = int(min(max(whole, -(g_n + 1)), g_n)) + g_n + 1
        _interpolate(ext[start : start + g_n + 2], back - whole, edges)
        edges[0], edges[g_n] = 0.0, total
        _difference(edges, out[n])
    dens = np.empty(2 * g_n - 1)
    norm = np.empty(g_n)
    x = np.empty(g_n)
    for j in range(blur_at.size):
        d = half[j]
        dens[g_n - 1 :] = d
        for k in range(1, g_n):
            dens[g_n - 1 - k] = d[k]
        _cumsum(d, norm)  # sum_h K[h, g] = sum of the offsets -(G - 1 - g) .. g
        for g in range(g_n // 2):
            norm[g], norm[g_n - 1 - g] = norm[g] + norm[g_n - 1 - g], norm[g_n - 1 - g] + norm[g]
        if g_n % 2:
            norm[g_n // 2] += norm[g_n // 2]
        row = out[blur_at[j]]
        _normalised(row, norm, d[0], x)
        _toeplitz(dens, x, row)
    for j in range(jump_at.size):
        _mix(out[jump_at[j]], jump[j], redrawn[j], _sum(redrawn[j]))
    for n in range(n_rows):
        values[n] = _dot(out[n], sig)


@njit
def _cumsum(x: np.ndarray, out: np.ndarray) -> float:
    acc = 0.0
    for g in range(x.size):
        acc += x[g]
        out[g] = acc
    return acc


@njit
def _interpolate(below: np.ndarray, frac: float, out: np.ndarray) -> None:
    """out[k] = below[k] (1 - frac) + below[k + 1] frac."""
    for k in range(out.size):
        out[k] = below[k] * (1.0 - frac) + below[k + 1] * frac


@njit
def _difference(edges: np.ndarray, out: np.ndarray) -> None:
    for h in range(out.size):
        out[h] = edges[h + 1] - edges[h]


@njit
def _normalised(w: np.ndarray, norm: np.ndarray, centre: float, out: np.ndarray) -> None:
    for g in range(w.size):
        out[g] = w[g] / (norm[g] - centre)


@njit(fastmath={"reassoc"})
def _toeplitz(dens: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out_h = sum_g dens[G - 1 - h + g] x_g, four outputs a pass over x, each sum in the
    order the compiler vectorises it (reassociated, as numpy's own products are). Every
    index is a loop counter plus a constant: with an offset computed at run time the
    compiler cannot rule out a negative index (numba wraps those) and does not vectorise."""
    g_n = x.size
    top = g_n - g_n % 4
    for h in range(0, top, 4):
        a0 = a1 = a2 = a3 = 0.0
        d = dens[g_n - 4 - h :]
        for g in range(g_n):
            xg = x[g]
            a0 += xg * d[g + 3]
            a1 += xg * d[g + 2]
            a2 += xg * d[g + 1]
            a3 += xg * d[g]
        out[h], out[h + 1], out[h + 2], out[h + 3] = a0, a1, a2, a3
    for h in range(top, g_n):
        out[h] = _dot(x, dens[g_n - 1 - h : 2 * g_n - 1 - h])


@njit
def _mix(row: np.ndarray, jump: float, other: np.ndarray, total: float) -> None:
    for g in range(row.size):
        row[g] = (1.0 - jump) * row[g] + jump * (other[g] / total)


@njit(fastmath={"reassoc"})
def _sum(x: np.ndarray) -> float:
    acc = 0.0
    for g in range(x.size):
        acc += x[g]
    return acc


@njit(cache=True)
def track_gauss(
    moments: np.ndarray, shift: np.ndarray, var: np.ndarray, widen: float, theta: np.ndarray,
    out: np.ndarray,
) -> None:  # fmt: skip
    """The log-density (N, G), less its largest cell, of the Gaussian on the grid with mean
    moments[:, 0] + shift and variance moments[:, 1] - moments[:, 0]^2 + var + widen."""
    for n in range(out.shape[0]):
        mean = moments[n, 0]
        spread = 2.0 * (moments[n, 1] - mean * mean + var[n] + widen)
        centre, row = mean + shift[n], out[n]
        for g in range(theta.size):
            row[g] = -((theta[g] - centre) * (theta[g] - centre)) / spread
        row -= row.max()


@njit(fastmath={"reassoc"})
def _dot(x: np.ndarray, y: np.ndarray) -> float:
    acc = 0.0
    for g in range(x.size):
        acc += x[g] * y[g]
    return acc


@njit(cache=True)
def track_update(
    post: np.ndarray,
    likelihood: np.ndarray,
    which: np.ndarray,
    weights: np.ndarray,
    rows: np.ndarray,
    floor: float,
) -> None:
    """Bayes' rule, written into weights[rows[n]]: post[n] x likelihood[which[n]],
    normalised, each cell raised to at least ``floor``."""
    g_n = post.shape[1]
    for n in range(rows.size):
        w, lik, dst = post[n], likelihood[which[n]], weights[rows[n]]
        acc = 0.0
        for g in range(g_n):
            dst[g] = lik[g] * w[g]
            acc += dst[g]
        for g in range(g_n):
            dst[g] = max(dst[g] / acc, floor)
