"""``basis_track``'s per-step arithmetic on its (streams S, filters C, batch B) arrays,
compiled with numba: the batch's rows gathered from the state, the predictions'
log-likelihoods and residuals, the common level's steps (without each prompt and on the
whole batch), the filters' mixing scores, the drift's arguments and the state's updates,
which numpy ran as some hundred small calls a step. ``TrackKernel._step`` calls them in
order around the row loops (the predictions, :mod:`predict_loops`; the drift, :mod:`loops`),
which it calls itself: numba's on-disk cache knows a compiled loop's own file only, so no
loop here calls one of another file (a change there would leave a stale copy here) but the
prefetch hint :func:`lanes._prefetch`, which changes no number.

The exponentials and logarithms stay in numpy: on CPUs with AVX-512 its vectorised exp,
log and log1p differ from the C library's (numba's) in the last bit, which the filter's
tails would carry on. So each kernel ends where the next needs one, their arguments written
into one buffer that numpy maps in one call. Everything else is numpy's arithmetic in
numpy's order (no multiply-add contracted, a sum over the batch numpy's pairwise sum, a sum
without one term :func:`sum_without`): the numbers are those of the numpy code bit for bit
(tests/test_kernels_before.py holds them to it).

Row n = (s C + c) B + b is filter c's copy of the prompt cols[s, b]; m = s C + c. The row
loops take the rows in another order, k = (s B + b) C + c, a prompt's filters one after
another, whose posteriors are adjacent in the state (S, P, C, G): gather's and advance's
arguments of theirs (the rows, work[MOVED], work[VAR], work[NEG], which) are in that order,
and order[k] = n.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from basis_bench.estimators.lanes import _prefetch
from basis_bench.estimators.loops import _helper

# rows of the (WORK, N) scratch the kernels pass on
LAST, LAST_JUMPS, MOVED, VAR, NEG, RESID, CURV = range(7)
WORK = 7
# rows of the (LEVELS, M) scratch: the batch's residual and sensitivity sums, the jump rate
RESID_ALL, CURV_ALL, RATE = range(3)
# what gather found: a prompt twice in a batch, a reward not 0/1, one outside [0, 1] (or NaN)
COPIES, FRACTIONAL, OUTSIDE = 1, 2, 4
P_CLIP = 1e-12  # predictions clipped to [P_CLIP, 1 - P_CLIP] in the log-likelihood
SPREAD_FLOOR = 1e-12  # the level's evidence variance, floored (see level_spreads)


@njit(cache=True, error_model="numpy")
def gather(
    step: np.ndarray, last_visit: np.ndarray, level: np.ndarray, jump_clock: np.ndarray,
    visit_level: np.ndarray, visit_jump_clock: np.ndarray, cols: np.ndarray, r: np.ndarray,
    drift: np.ndarray, rows: np.ndarray, order: np.ndarray, gap: np.ndarray,
    first: np.ndarray, which: np.ndarray, work: np.ndarray,
) -> int:  # fmt: skip
    """The batch's rows of the state, before the batch: rows[k] = (s P + cols[s, b]) C + c
    (the flat (S P C, G) posteriors) and order[k] = n, the level and jump clock at the last
    visit (work[LAST, n], work[LAST_JUMPS, n]), moved = u_m - last, gap (S, B) = step_s -
    last_visit, and with J = jump_clock_m - last_jumps the drift's var = rho gap + kappa J
    and neg = -eta J (its jump probability 1 - e^neg) into work[MOVED, k], work[VAR, k],
    work[NEG, k]; drift (C, 3) each filter's (rho, kappa, eta). first[s, b]: the batch's
    first row of the same prompt; which[k]: a 0/1 reward's likelihood line (its value).
    Returns COPIES | FRACTIONAL | OUTSIDE as found (the rewards' check: it writes no
    state). The rows' cache lines are asked for first, all at once (:func:`lanes._prefetch`):
    the state's (S, P, C) arrays are read a prompt at a time at random, and a read waiting
    on memory stalls the loop where a prefetch does not."""
    n_s, n_b = cols.shape
    n_c, n_p = level.shape[1], visit_level.shape[1]
    for s in range(n_s):
        for b in range(n_b):
            _prefetch(last_visit, s, cols[s, b])
        for b in range(n_b):
            for c in range(0, n_c, 8):  # (P, C): a prompt's C filters' values, one run
                _prefetch(visit_level[s], cols[s, b], c)
                _prefetch(visit_jump_clock[s], cols[s, b], c)
    flags = 0
    for s in range(n_s):
        for b in range(n_b):
            col = cols[s, b]
            gap[s, b] = step[s] - last_visit[s, col]
            first[s, b] = b
            for j in range(b):
                if cols[s, j] == col:
                    first[s, b] = j
                    flags |= COPIES
                    break
            flags |= _reward_kind(r[s, b])
        for c in range(n_c):
            m = s * n_c + c
            for b in range(n_b):
                n, k, col = m * n_b + b, (s * n_b + b) * n_c + c, cols[s, b]
                rows[k], order[k] = (s * n_p + col) * n_c + c, n
                which[k] = 1 if r[s, b] == 1.0 else 0
                last, last_jumps = visit_level[s, col, c], visit_jump_clock[s, col, c]
                work[LAST, n], work[LAST_JUMPS, n] = last, last_jumps
                work[MOVED, k] = level[s, c] - last
                jumps = jump_clock[s, c] - last_jumps
                work[VAR, k] = drift[c, 0] * gap[s, b] + drift[c, 1] * jumps
                work[NEG, k] = -drift[c, 2] * jumps
    return flags


@_helper()
def _reward_kind(x: float) -> int:
    """0 for a 0/1 reward, FRACTIONAL for one strictly between, FRACTIONAL | OUTSIDE for
    one outside [0, 1] or not a number."""
    if x == 0.0 or x == 1.0:
        return 0
    return FRACTIONAL if 0.0 < x < 1.0 else FRACTIONAL | OUTSIDE


@njit(cache=True, error_model="numpy")
def residuals(
    p: np.ndarray, r: np.ndarray, level_var: np.ndarray, jumps: np.ndarray,
    decayed: np.ndarray, weight: np.ndarray, jump_prior: float, noise: np.ndarray,
    decay: float, work: np.ndarray, levels: np.ndarray, logs: np.ndarray, neg_p: np.ndarray,
) -> None:  # fmt: skip
    """From the predictions p (N,): logs[:N] = clip(p, P_CLIP, 1 - P_CLIP) and neg_p its
    negation (the log-likelihood r log p + (1 - r) log1p(-p)); at p clipped to [0, 1] the
    residuals e = r - p and sensitivities h = p (1 - p), without each row (work[RESID],
    work[CURV], :func:`sum_without`) and over the batch (levels[RESID_ALL],
    levels[CURV_ALL]); the level's jump rate (S, C), levels[RATE] = (jumps + a) /
    (sum_a decay^a + w), sum_a decay^a = (1 - decay^step) / (1 - decay) (``decayed``:
    decay^step), a = ``jump_prior`` and w (C,) the regime's prior weight; and the level's evidence variances
    (:func:`level_spreads`), calm then jumping, without each row into logs[N:3N] and over
    the batch into logs[3N:]."""
    n_s, n_c = level_var.shape
    n_b = r.shape[1]
    n_rows, n_m = p.size, n_s * n_c
    e, h = np.empty(n_rows), np.empty(n_rows)
    for s in range(n_s):
        for c in range(n_c):
            m = s * n_c + c
            for b in range(n_b):
                n = m * n_b + b
                logs[n] = _clip(p[n], P_CLIP, 1.0 - P_CLIP)
                neg_p[n] = -logs[n]
                q = _clip(p[n], 0.0, 1.0)
                e[n], h[n] = r[s, b] - q, q * (1.0 - q)
            levels[RESID_ALL, m] = 0.0 + _pairwise_sum(e[m * n_b : (m + 1) * n_b])
            levels[CURV_ALL, m] = 0.0 + _pairwise_sum(h[m * n_b : (m + 1) * n_b])
            steps = (1.0 - decayed[s]) / (1.0 - decay)
            levels[RATE, m] = (jumps[s, c] + jump_prior) / (steps + weight[c])
    sum_without(e.reshape((n_m, n_b, 1)), work[RESID].reshape((n_m, n_b, 1)))
    sum_without(h.reshape((n_m, n_b, 1)), work[CURV].reshape((n_m, n_b, 1)))
    for n in range(n_rows):
        var = level_var.flat[n // n_b]
        for k in range(2):
            logs[(1 + k) * n_rows + n] = level_spreads(work[CURV, n], var + noise[k])
    for m in range(n_m):
        for k in range(2):
            spread = level_spreads(levels[CURV_ALL, m], level_var.flat[m] + noise[k])
            logs[3 * n_rows + k * n_m + m] = spread


@_helper()
def _clip(x: float, lo: float, hi: float) -> float:
    """numpy's clip: min(max(x, lo), hi), a tie to the bound."""
    x = x if x > lo else lo
    return x if x < hi else hi


@_helper()
def _pairwise_sum(x: np.ndarray) -> float:
    """numpy's sum of x, the pairwise summation of a reduction along a contiguous axis:
    below 8 terms in order; up to 128 eight running sums (term j into sum j mod 8) combined
    ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), then the rest in order; above 128
    the sums of the two halves (the first a multiple of 8 terms long), added."""
    n = x.size
    if n < 8:
        acc = 0.0
        for i in range(n):
            acc += x[i]
        return acc
    if n > 128:
        half = n // 2
        half -= half % 8
        return _pairwise_sum(x[:half]) + _pairwise_sum(x[half:])
    r0, r1, r2, r3, r4, r5, r6, r7 = x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]
    i = 8
    while i < n - n % 8:
        r0, r1, r2, r3 = r0 + x[i], r1 + x[i + 1], r2 + x[i + 2], r3 + x[i + 3]
        r4, r5, r6, r7 = r4 + x[i + 4], r5 + x[i + 5], r6 + x[i + 6], r7 + x[i + 7]
        i += 8
    acc = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        acc += x[i]
        i += 1
    return acc


@_helper()
def level_spreads(h: float, prior: float) -> float:
    """The variance of the batch's residual sum E under a level of variance ``prior``
    (Laplace: E ~ N(0, H + H^2 prior), H = ``h`` the sensitivity), floored: a batch whose
    predictions are all 0 or 1 carries no information on the level, and its H may round a
    hair below 0."""
    spread = h + h * h * prior
    return spread if spread > SPREAD_FLOOR else SPREAD_FLOOR


@njit(cache=True, error_model="numpy")
def scores(
    spreads: np.ndarray, logs: np.ndarray, log1p: np.ndarray, r: np.ndarray,
    where: np.ndarray, evidence: np.ndarray, pool: float, memory: float, work: np.ndarray,
    levels: np.ndarray, exps: np.ndarray,
) -> None:  # fmt: skip
    """With the logarithms of :func:`residuals`' buffer (``logs`` of ``spreads``; log1p of
    -p): each row's log-likelihood r log p + (1 - r) log1p(-p); the level's evidence for a
    jump against calm, d = ev_c - ev_j with ev_q = -(log S_q + E^2 / S_q) / 2, without each
    row into exps[:N] and over the batch into exps[N:N + M]; the filters' mixing scores
    (:func:`track_mixing`, ``where`` each prompt's difficulty bin) less their maximum over
    the filters into exps[N + M:] (S, C, B) (their softmax's exponent); and the evidence
    learnt, evidence = (evidence + the batch's log-likelihoods by bin) x ``memory``."""
    n_s, n_b = r.shape
    n_c = evidence.shape[1]
    n_rows, n_m = n_s * n_c * n_b, n_s * n_c
    ll = np.empty(n_rows)
    for s in range(n_s):
        for n in range((s * n_c) * n_b, (s + 1) * n_c * n_b):
            x = r[s, n % n_b]
            ll[n] = x * logs[n] + (1.0 - x) * log1p[n]
    for n in range(n_rows):
        exps[n] = _jump_evidence(spreads, logs, work[RESID, n], n_rows + n, 2 * n_rows + n)
    for m in range(n_m):
        j = 3 * n_rows + m
        exps[n_rows + m] = _jump_evidence(spreads, logs, levels[RESID_ALL, m], j, j + n_m)
    mixed, counts = np.empty((n_s, n_c, n_b)), np.empty(evidence.shape)
    track_mixing(evidence, where, ll.reshape((n_s, n_c, n_b)), pool, mixed, counts)
    z = exps[n_rows + n_m :].reshape((n_s, n_c, n_b))
    for s in range(n_s):
        for b in range(n_b):
            top = mixed[s, 0, b]
            for c in range(1, n_c):
                top = max(top, mixed[s, c, b])
            for c in range(n_c):
                z[s, c, b] = mixed[s, c, b] - top
    for s in range(n_s):
        for c in range(n_c):
            for k in range(evidence.shape[2]):
                evidence[s, c, k] = (evidence[s, c, k] + counts[s, c, k]) * memory


@_helper()
def _jump_evidence(spreads: np.ndarray, logs: np.ndarray, e: float, calm: int, jump: int) -> float:
    """ev_c - ev_j, ev_q = -(log S_q + e^2 / S_q) / 2: S_q = spreads[i], log S_q = logs[i]."""
    ev_c = -0.5 * (logs[calm] + e * e / spreads[calm])
    ev_j = -0.5 * (logs[jump] + e * e / spreads[jump])
    return ev_c - ev_j


@njit(cache=True, error_model="numpy")
def advance(
    exps: np.ndarray, cols: np.ndarray, gap: np.ndarray, first: np.ndarray,
    drift: np.ndarray, noise: np.ndarray, decay: float, work: np.ndarray,
    levels: np.ndarray, state: tuple,
) -> None:  # fmt: skip
    """With e^d of :func:`scores`' jump evidence (exps[:N + M]): each filter's level
    without each row (:func:`level_collapse`), and the drift's arguments from it (row k's
    at k), shift = work[MOVED] = u_loo - last, with J = jump_clock + jumped_loo - last_jumps
    var = work[VAR] = rho gap + kappa J and work[NEG] = -eta J.
    Then the state learns, ``state`` = (step, last_visit, level, level_var, jumps,
    jump_clock, visit_level, visit_jump_clock): each row's level and jump clock at this visit
    (a prompt's copies its first copy's), the level on the whole batch, the discounted jump
    count jumps = decay jumps + jumped, the clock jump_clock + jumped, the visits, the step.
    """
    step, last_visit, level, level_var, jumps, jump_clock, visit_level, visit_clock = state
    n_s, n_b = cols.shape
    n_c = level.shape[1]
    n_rows = n_s * n_c * n_b
    loo_level, loo_jumped = np.empty(n_b), np.empty(n_b)
    for s in range(n_s):
        for c in range(n_c):
            m = s * n_c + c
            u, v, rate, clock = level[s, c], level_var[s, c], levels[RATE, m], jump_clock[s, c]
            for b in range(n_b):
                n, k = m * n_b + b, (s * n_b + b) * n_c + c
                resid, h = work[RESID, n], work[CURV, n]
                mean, _, jumped = level_collapse(u, v, rate, resid, h, exps[n], noise)
                loo_level[b], loo_jumped[b] = mean, jumped
                work[MOVED, k] = mean - work[LAST, n]
                j = clock + jumped - work[LAST_JUMPS, n]
                work[VAR, k] = drift[c, 0] * gap[s, b] + drift[c, 1] * j
                work[NEG, k] = -drift[c, 2] * j
            for b in range(n_b):
                visit_level[s, cols[s, b], c] = loo_level[first[s, b]]
                visit_clock[s, cols[s, b], c] = clock + loo_jumped[first[s, b]]
            resid, h = levels[RESID_ALL, m], levels[CURV_ALL, m]
            mean, spread, jumped = level_collapse(u, v, rate, resid, h, exps[n_rows + m], noise)
            level[s, c], level_var[s, c] = mean, spread
            jumps[s, c] = jumps[s, c] * decay + jumped
            jump_clock[s, c] = clock + jumped
    for s in range(n_s):
        for b in range(n_b):
            last_visit[s, cols[s, b]] = step[s]
        step[s] += 1.0


@_helper()
def level_collapse(
    u: float, v: float, rate: float, resid: float, h: float, odds: float, noise: np.ndarray
) -> tuple[float, float, float]:
    """The common level's step on a batch's residual sum E = ``resid`` with sensitivity H
    = ``h`` (an interacting-multiple-model step): under each step variance q of ``noise``
    (calm, jumping), the Newton step u + E V_q, V_q = 1 / (1 / (v + q) + H); the jump's
    posterior probability 1 / (1 + (1 - rate) / rate x ``odds``), odds = e^(ev_c - ev_j)
    the evidence ratio (:func:`scores`); the two collapsed into one mean and variance."""
    v_c = 1.0 / (1.0 / (v + noise[0]) + h)
    v_j = 1.0 / (1.0 / (v + noise[1]) + h)
    u_c, u_j = u + resid * v_c, u + resid * v_j
    jumped = 1.0 / (1.0 + (1.0 - rate) / rate * odds)
    mean = (1.0 - jumped) * u_c + jumped * u_j
    d_c, d_j = u_c - mean, u_j - mean
    spread = (1.0 - jumped) * (v_c + d_c * d_c) + jumped * (v_j + d_j * d_j)
    return mean, spread, jumped


@njit(cache=True, error_model="numpy")
def sum_without(x: np.ndarray, out: np.ndarray) -> None:
    """out[m, i, k] = sum_{j < i} x[m, j, k] + sum_{j > i} x[m, j, k]: the terms before i
    summed from the first on, those after i from the last back, and the two added (0 for an
    empty side), as numpy's cumulative sums would: no x_i enters, not even as rounding."""
    n_m, n_b, n_k = x.shape
    for m in range(n_m):
        for k in range(n_k):
            out[m, 0, k] = 0.0
            if n_b > 1:
                acc = x[m, 0, k]
                out[m, 1, k] = acc
                for i in range(2, n_b):
                    acc += x[m, i - 1, k]
                    out[m, i, k] = acc
                acc = x[m, n_b - 1, k]
                out[m, n_b - 2, k] += acc
                for i in range(n_b - 3, -1, -1):
                    acc += x[m, i + 1, k]
                    out[m, i, k] += acc
            out[m, n_b - 1, k] += 0.0


@njit(cache=True, error_model="numpy")
def mixed_values(ez: np.ndarray, value: np.ndarray, out: np.ndarray) -> None:
    """The batch's baselines out (S, B) = sum_c w_c value_c, the filters' softmax w_c = ez_c
    / sum_c ez_c of e^ :func:`scores`' exponents ez (S, C, B), value (S, B, C) each filter's
    (:func:`loops.track_drift`): the filters added in order from 0, each product rounded
    (no multiply-add), the numbers of numpy's ``ez / ez.sum(c)`` and einsum over the
    filters' axis where the batch axis is their inner loop (B > 1; with B = 1 numpy's
    vectorised sums reassociate, a few units in the last place apart)."""
    n_s, n_c, n_b = ez.shape
    for s in range(n_s):
        for b in range(n_b):
            total = 0.0
            for c in range(n_c):
                total += ez[s, c, b]
            acc = 0.0
            for c in range(n_c):
                acc += ez[s, c, b] / total * value[s, b, c]
            out[s, b] = acc


@njit(cache=True, error_model="numpy")
def track_mixing(
    evidence: np.ndarray,
    where: np.ndarray,
    ll: np.ndarray,
    pool: float,
    mixed: np.ndarray,
    counts: np.ndarray,
) -> None:
    """``basis_track``'s filters' scores before their softmax, mixed (S, C, B) = (1 - pool)
    a_{c,k_i} + pool sum_k a_{c,k} with a_{c,k} = evidence[s, c, k] + the log-likelihoods
    ll (S, C, B) of the batch's other prompts in bin k (:func:`sum_without`; ``where`` (S, B)
    each prompt's bin), and each bin's log-likelihoods counts (S, C, K): numpy's
    arithmetic in numpy's order (a prompt's term ll x 1 in its bin, ll x 0 in the others;
    the sums over bins and over the batch in order)."""
    n_s, n_c, n_b = ll.shape
    n_k = evidence.shape[2]
    terms, others = np.empty((1, n_b, n_k)), np.empty((1, n_b, n_k))
    for s in range(n_s):
        for c in range(n_c):
            for b in range(n_b):
                for k in range(n_k):
                    terms[0, b, k] = ll[s, c, b] * (1.0 if where[s, b] == k else 0.0)
            sum_without(terms, others)
            for k in range(n_k):
                acc = 0.0  # numpy's reduction starts from 0 (a sum of -0s is 0)
                for b in range(n_b):
                    acc += terms[0, b, k]
                counts[s, c, k] = acc
            for b in range(n_b):
                total = own = evidence[s, c, 0] + others[0, b, 0]
                for k in range(1, n_k):
                    score = evidence[s, c, k] + others[0, b, k]
                    total += score
                    if where[s, b] == k:
                        own = score
                mixed[s, c, b] = (1.0 - pool) * own + pool * total
