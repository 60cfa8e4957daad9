"""``basis_track``'s row loops, compiled with numba: each posterior row of a batch read from
the state by index, moved, blurred, mixed with the redrawn Gaussian, valued and updated,
element by element, where numpy ran a dozen passes over (rows, G) arrays. The Gaussians are
running products (:func:`_gauss_cells`, :func:`_densities`), the sums reassociated as
numpy's own products are (``fastmath={"reassoc"}``), and the blur (:func:`_toeplitz`) runs
on vectors of LANES doubles with fused multiply-adds, in an order of its own (some 1e-14
relative a cell). Imported on first use (``import numba`` takes a fraction of a second),
compiled once into numba's disk cache. The predictions' loop is :mod:`predict_loops`';
``basis_memory``'s and ``basis_context``'s :mod:`memory_loops`'.

The loops read the state's rows by index, in no order the CPU can guess: each asks for the
row AHEAD rows on (a prefetch, :func:`_prefetch`) before working on its own, so the reads
from memory overlap the arithmetic instead of stalling it (the same numbers). The prefetch
and the vector operations of the blur and its densities are numba intrinsics (LLVM
instructions written out, :mod:`lanes`; after a change there, touch this file: numba's disk
cache knows a compiled loop's own file only, and an intrinsic is compiled into its caller).

Three things cost more than the arithmetic, and the loops are written around them: numba
counts the references of an array a function receives or a view it makes (an atomic add,
which waits for the CPU's pending writes), so the helpers are compiled without (``_nrt=
False``: they allocate nothing) and take rows by index, buffers at offsets, never views; a
product of subnormal numbers (below 2^-1022) takes the CPU a hundred cycles or more, so the
Gaussians' cells below TINY are 0; a vector read of cells just written one by one waits for
every write to land, so the drift makes each row's blur a row ahead (:func:`track_drift`).
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
from numba import njit

from basis_bench.estimators.lanes import (
    LANES,
    _add,
    _fma,
    _keep_first,
    _last,
    _load,
    _plus,
    _prefetch,
    _reciprocal,
    _reverse,
    _scan,
    _splat_at,
    _store,
    _zero,
)

AHEAD = 4  # rows prefetched ahead of the one being worked on
# a Gaussian's cells (the blur's densities, the redrawn posterior) below this are 0: each
# product of the blur then stays far above 2^-1022 (posteriors are >= 1e-250), not subnormal
TINY = 1e-50
LOG_TINY = float(np.log(TINY))


def _helper(**options: Any) -> Any:
    """numba's njit for a helper of the loops: numpy's error model and no reference counts
    (``_nrt=False``; a helper allocates nothing), so passing it arrays costs no atomic adds."""
    return cast(Any, njit)(error_model="numpy", _nrt=False, **options)


@_helper()
def _prefetch_row(array: np.ndarray, rows: np.ndarray, n: int) -> None:
    """Prefetch every cache line of array[rows[n]] if there is such a row."""
    if n < rows.size:
        last = array.shape[1] - 1
        for j in range(0, last, 8):
            _prefetch(array, rows[n], j)
        _prefetch(array, rows[n], last)


@njit(cache=True, error_model="numpy")
def track_drift(
    weights: np.ndarray,
    rows: np.ndarray,
    shift: np.ndarray,
    var: np.ndarray,
    jump: np.ndarray,
    moments: np.ndarray,
    theta: np.ndarray,
    sig: np.ndarray,
    jump_var: float,
    out: np.ndarray,
    values: np.ndarray,
    likelihood: np.ndarray,
    which: np.ndarray,
    floor: float,
) -> None:
    """Each row's posterior before the visit out (N, G) and its mean value (N,) sum_g out_g
    sig_g, from w = weights[rows[n]] on the evenly spaced grid theta. With a likelihood
    table (L, G) (empty: none), the posterior is not written to ``out`` (one row of
    scratch) but updated at once into weights[rows[n]] (:func:`track_update`, while the row
    is in cache): the rows must then be distinct.

    * moved by shift[n] / spacing grid steps, each cell's mass spread uniformly over the
      cell (:func:`_moved`);
    * blurred by N(0, var[n]) unless the density one cell away is below TINY (then it
      is the identity to 1e-50): out_h = sum_g K[h, g] w_g / norm_g, K[h, g] = d_|h - g|
      the Gaussian's density at the offset (0 below TINY), norm_g = sum_h K[h, g]
      (:func:`_densities`);
    * a row with jump != 0 mixed with the redrawn posterior, (1 - jump) out + jump
      redrawn: the Gaussian on the grid with the old posterior's mean (moments[n, 0]) moved
      by shift[n] and its variance (moments[n, 1] - mean^2) widened by var[n] + jump_var,
      normalised.
    """
    n_rows, g_n = rows.size, out.shape[1]
    spacing, span = theta[1] - theta[0], 2 * g_n - 1
    x, scratch, ones = np.empty(g_n), np.empty(g_n), np.ones(g_n)
    # two slots (at offsets) of a row's redrawn posterior and result, row n's n % 2, and of
    # its blur, row n's `slot` (the other one's unless it shares the last row's): each pass
    # makes row n + 1's blur, finishes row n - 1 and moves and blurs row n, three
    # independent chains the CPU overlaps, each reading buffers written a pass before
    dens, inv = np.empty(2 * span), np.empty(2 * g_n)
    redrawn, row = np.empty(2 * g_n), np.empty(2 * g_n)
    for n in range(min(AHEAD, n_rows)):
        _prefetch_row(weights, rows, n)
    update = likelihood.shape[0] > 0
    q, slot = 0.0, 0  # row n's density one cell away and the slot of its blur
    if n_rows:
        q = _prepare(
            0, shift, var, jump, moments, theta, jump_var, dens, inv, redrawn, scratch, 0, 0.0
        )
    for n in range(n_rows + 1):
        _prefetch_row(weights, rows, n + AHEAD)
        if n > 0:
            _finish(n - 1, jump, redrawn, sig, row, values, likelihood, which, weights,
                    rows, floor, update, out)  # fmt: skip
        if n == n_rows:
            break
        q_next, slot_next = 0.0, 1 - slot
        if n + 1 < n_rows:
            # the last row's variance (kappa = 0, eta or the regime apart): its densities
            known = q if q > 0.0 and var[n + 1] == var[n] else 0.0
            slot_next = slot if known > 0.0 else slot_next
            q_next = _prepare(
                n + 1, shift, var, jump, moments, theta, jump_var, dens, inv, redrawn, scratch,
                slot_next, known,
            )  # fmt: skip
        at = (n % 2) * g_n
        if q > 0.0:
            _moved(weights, rows[n], shift[n] / spacing, inv, slot * g_n, x, 0)
            _toeplitz(dens, slot * span, x, row, at)
        else:
            _moved(weights, rows[n], shift[n] / spacing, ones, 0, row, at)
        q, slot = q_next, slot_next


@_helper()
def _finish(
    n: int, jump: np.ndarray, redrawn: np.ndarray, sig: np.ndarray, row: np.ndarray,
    values: np.ndarray, likelihood: np.ndarray, which: np.ndarray, weights: np.ndarray,
    rows: np.ndarray, floor: float, update: bool, out: np.ndarray,
) -> None:  # fmt: skip
    """Row n's posterior, moved and blurred in row[at : at + G], at = (n % 2) G: mixed with
    its redrawn one if jump[n] != 0, valued into values[n], then updated into weights[rows[n]]
    (``update``) or written to out[n]."""
    g_n = sig.size
    at = (n % 2) * g_n
    if jump[n] != 0.0:
        _mix(row, at, jump[n], redrawn)
    values[n] = _dot_at(row, at, sig)
    if update:
        _bayes(row, at, likelihood, which[n], weights, rows[n], floor)
    else:
        for g in range(g_n):
            out[n, g] = row[np.uintp(at + g)]


@_helper()
def _prepare(
    n: int, shift: np.ndarray, var: np.ndarray, jump: np.ndarray, moments: np.ndarray,
    theta: np.ndarray, jump_var: float, dens: np.ndarray, inv: np.ndarray,
    redrawn: np.ndarray, scratch: np.ndarray, slot: int, known: float,
) -> float:  # fmt: skip
    """Row n's blur, into blur slot ``slot``, and redrawn posterior, into slot n % 2: the
    density one cell away q (0: no blur, where it is below TINY) and, if q > 0, the densities
    and 1 / norm_g (:func:`_densities`), unless ``known`` > 0 is q of the densities already
    in the slot (the last row's, of the same variance); if jump[n] != 0 the redrawn
    posterior (:func:`_redrawn`). Returns q."""
    g_n = theta.size
    spacing = theta[1] - theta[0]
    q = known
    if known == 0.0:
        log_q = -spacing * spacing / (2.0 * max(var[n], 1e-12))
        if log_q >= LOG_TINY:  # no blur where the density one cell away is below TINY
            q = np.exp(log_q)
            reach = int(min(np.sqrt(LOG_TINY / log_q), g_n - 1.0))  # the last k: d_k >= TINY
            _densities(q, reach, dens, slot * (2 * g_n - 1), inv, slot * g_n, scratch)
    if jump[n] != 0.0:
        mean, second = moments[n, 0], moments[n, 1]
        _redrawn(mean, second, shift[n], var[n] + jump_var, theta, redrawn, (n % 2) * g_n)
    return q


@_helper()
def _moved(
    weights: np.ndarray, i: int, move: float, scale: np.ndarray, at: int, out: np.ndarray,
    out_at: int,
) -> None:  # fmt: skip
    """out[out_at : out_at + G] = w = weights[i] moved by ``move`` cells, each cell's mass
    spread uniformly over it, times scale[at : at + G]: with back = -move = k + f (k whole,
    0 <= f < 1), out_h = (1 - f) w_(h + k) + f w_(h + k + 1) (w 0 off the grid), and the
    mass moved off either end kept in the end cells: out_0 = (1 - f) M(k + 1) + f M(k + 2), out_(G - 1) = (1 - f) T(k
    + G - 1) + f T(k + G), M(j) the mass below cell j and T(j) the mass from cell j up.
    Every cell a sum of terms >= 0, so within a few roundings of its exact value, however
    small (a cell as the difference of two cumulative masses would carry the total's
    rounding, some 1e-16)."""
    g_n = weights.shape[1]
    back = -move
    whole = np.floor(back)
    frac = back - whole
    keep = 1.0 - frac
    k = int(min(max(whole, -(g_n + 1.0)), float(g_n)))
    first = _mass(weights, i, 0, k + 1) * keep + _mass(weights, i, 0, k + 2) * frac
    last = _mass(weights, i, k + g_n - 1, g_n) * keep + _mass(weights, i, k + g_n, g_n) * frac
    # h + k and h + k + 1 on the grid for lo <= h < hi; only one of them for h = -1 - k
    # (k < 0) and h = G - 1 - k (k >= 0)
    lo, hi = min(max(-k, 0), g_n), max(min(g_n - 1 - k, g_n), 0)
    o = np.uintp(out_at)
    for h in range(lo):
        out[o + np.uintp(h)] = 0.0
    for h in range(lo, hi):
        u = np.uintp(h + k)
        v = weights[i, u] * keep + weights[i, u + np.uintp(1)] * frac
        out[o + np.uintp(h)] = v * scale[np.uintp(at + h)]
    for h in range(hi, g_n):
        out[o + np.uintp(h)] = 0.0
    if -g_n <= k <= -1:
        out[out_at - 1 - k] = weights[i, 0] * frac * scale[at - 1 - k]
    if 0 <= k <= g_n - 1:
        out[out_at + g_n - 1 - k] = weights[i, g_n - 1] * keep * scale[at + g_n - 1 - k]
    out[out_at] = first * scale[at]
    out[out_at + g_n - 1] = last * scale[at + g_n - 1]


@_helper(fastmath={"reassoc"})
def _mass(weights: np.ndarray, i: int, lo: int, hi: int) -> float:
    """weights[i, lo:hi].sum() (lo, hi clipped to the grid), on vectors."""
    g_n = weights.shape[1]
    acc = 0.0
    for g in range(min(max(lo, 0), g_n), min(max(hi, 0), g_n)):
        acc += weights[i, np.uintp(g)]
    return acc


@_helper()
def _densities(
    q: float, reach: int, dens: np.ndarray, at: int, inv: np.ndarray, inv_at: int,
    scratch: np.ndarray,
) -> None:  # fmt: skip
    """The blur's densities dens[at + G - 1 +- k] = d_k = q^(k^2), 0 past ``reach`` (where
    d_k < TINY), and each cell's 1 / norm_g into inv[inv_at + g] (:func:`_normalisers`).
    d_k for k < 8 a running product (:func:`_gauss_cells`'s), then d_(k + 8) = d_k r_k,
    r_k = q^(16 k + 64), r_(k + 8) = r_k q^128: two recurrences 8 apart (some 15 roundings
    a density at G = 64, not one chain of 64 products, each waiting on the last), on
    vectors where G is a multiple of LANES (:func:`_densities_on_vectors`); every factor
    >= TINY^3, no product subnormal."""
    g_n = scratch.size
    c = at + g_n - 1  # dens[c +- k] = d_k
    r = inv_at  # inv[r + k] = r_k, until the normalisers are made
    value, ratio, factor = 1.0, q, q * q
    scratch[0] = 1.0
    for k in range(1, min(8, reach + 1)):
        value *= ratio
        ratio *= factor
        scratch[k] = value
    if reach >= 8:
        q16 = scratch[4]
        inv[np.uintp(r)] = value * ratio  # q^64
        for k in range(1, 8):
            inv[np.uintp(r + k)] = inv[np.uintp(r + k - 1)] * q16
        q128 = inv[np.uintp(r)] * inv[np.uintp(r)]
        if g_n % LANES == 0 and LANES == 8:
            inv[np.uintp(r + 8)] = q128
            _densities_on_vectors(reach, dens, c, inv, inv_at, scratch)
            return
        for k in range(8, reach + 1):
            scratch[k] = scratch[k - 8] * inv[np.uintp(r + k - 8)]
            inv[np.uintp(r + k)] = inv[np.uintp(r + k - 8)] * q128
    for k in range(reach + 1, g_n):
        scratch[k] = 0.0
    for k in range(g_n):
        dens[np.uintp(c + k)] = scratch[k]
    for k in range(g_n):
        dens[np.uintp(c - k)] = scratch[k]
    _normalisers(dens, c, reach, inv, inv_at, scratch)


@_helper()
def _densities_on_vectors(
    reach: int, dens: np.ndarray, c: int, inv: np.ndarray, inv_at: int, scratch: np.ndarray
) -> None:  # fmt: skip
    """:func:`_densities` a vector of LANES = 8 at a time, from d_0 .. d_7 in scratch[:8], r_0
    .. r_7 in inv[inv_at : inv_at + 8] and q^128 at inv[inv_at + 8] (reach >= 8): the same
    products d_(k + 8) = d_k r_k, so the same densities, written to dens both ways; their
    running sums P on the vectors (:func:`lanes._scan`, each vector's last lane carried into
    the next), and all G norms' 1 / (P_g + P_(G - 1 - g) - 1) (:func:`lanes._reciprocal`):
    in registers, where :func:`_normalisers` reads the densities back one by one (a few ulp
    from its sums)."""
    g_n, nothing = scratch.size, _zero()
    d, ratios, q128 = _load(scratch, 0), _load(inv, inv_at), _splat_at(inv, inv_at + LANES)
    carry, last = nothing, reach - reach % LANES  # the last vector with a d_k >= TINY
    for j in range(0, g_n, LANES):
        if j > last:
            d = nothing
        elif j == last:
            d = _keep_first(d, reach + 1 - j)
        total = _add(_scan(d), carry)
        carry = _last(total)
        _store(dens, c + j, d)
        _store(dens, c - j - (LANES - 1), _reverse(d))
        _store(scratch, j, total)
        if j < last:
            d, ratios = _fma(d, ratios, nothing), _fma(ratios, q128, nothing)
    for j in range(0, g_n, LANES):
        norm = _plus(_add(_load(scratch, j), _reverse(_load(scratch, g_n - LANES - j))), -1.0)
        _store(inv, inv_at + j, _reciprocal(norm))


@_helper()
def _normalisers(
    dens: np.ndarray, c: int, reach: int, inv: np.ndarray, inv_at: int, scratch: np.ndarray
) -> None:  # fmt: skip
    """inv[inv_at + g] = 1 / norm_g, norm_g = P_g + P_(G - 1 - g) - 1, P the running sum of
    the densities d_k = dens[c + k] (:func:`_densities`; 0 past ``reach``, where P stops):
    in 4 runs side by side, each run's total added to the runs after it; the norms then
    divided on vectors, half of them (norm is symmetric)."""
    g_n, terms = scratch.size, reach + 1
    m = terms // 4
    a0 = a1 = a2 = a3 = 0.0
    for i in range(m):
        a0 += dens[np.uintp(c + i)]
        a1 += dens[np.uintp(c + m + i)]
        a2 += dens[np.uintp(c + 2 * m + i)]
        a3 += dens[np.uintp(c + 3 * m + i)]
        scratch[i], scratch[m + i], scratch[2 * m + i], scratch[3 * m + i] = a0, a1, a2, a3
    b1 = a0
    b2 = b1 + a1
    b3 = b2 + a2
    for i in range(m):
        scratch[m + i] += b1
        scratch[2 * m + i] += b2
        scratch[3 * m + i] += b3
    acc = b3 + a3
    for k in range(4 * m, terms):  # the last terms % 4
        acc += dens[np.uintp(c + k)]
        scratch[k] = acc
    for k in range(terms, g_n):
        scratch[k] = acc
    half, at = (g_n + 1) // 2, np.uintp(inv_at)
    for g in range(half):
        inv[at + np.uintp(g)] = scratch[g] + scratch[np.uintp(g_n - 1 - g)] - 1.0
    for g in range(half):
        inv[at + np.uintp(g)] = 1.0 / inv[at + np.uintp(g)]
    for g in range(half):
        inv[at + np.uintp(g_n - 1 - g)] = inv[at + np.uintp(g)]


@_helper()
def _redrawn(
    mean: float, second: float, shift: float, widen: float, theta: np.ndarray,
    out: np.ndarray, at: int,
) -> None:  # fmt: skip
    """out[at : at + G]: the Gaussian on the grid with mean ``mean`` + shift and variance
    second - mean^2 + widen, 1 at the cell nearest its mean (unnormalised). Cell top + k is
    a^k b^(k^2) of it, b = e^(-spacing^2 / spread), a = e^(-lead / spread): two running
    products from the top, up and down the grid (:func:`_gauss_cells`)."""
    g_n = theta.size
    spread = 2.0 * (second - mean * mean + widen)
    centre, spacing = mean + shift, theta[1] - theta[0]
    top = int(min(max(np.round((centre - theta[0]) / spacing), 0.0), g_n - 1.0))
    lead = 2.0 * (theta[top] - centre) * spacing
    a, b = np.exp(-lead / spread), np.exp(-spacing * spacing / spread)
    out[at + top] = 1.0
    _gauss_cells(1.0, a * b, b * b, out, at + top + 1, at + g_n, 1)
    _gauss_cells(1.0, b / a, b * b, out, at + top - 1, at - 1, -1)


@_helper()
def _gauss_cells(
    value: float, ratio: float, factor: float, out: np.ndarray, lo: int, hi: int, by: int
) -> None:
    """A Gaussian's cells out[lo], out[lo + by], .. (up to hi) as a running product: each
    the one before times ``ratio``, which is multiplied by ``factor`` a cell (the ratio of
    neighbouring cells of e^(-c k^2) is e^(-c (2 k - 1)), each e^(-2 c) times the last).
    Cells from the first below TINY on are 0 (the product would go on into the subnormals)."""
    g = lo
    while g != hi:
        value *= ratio
        ratio *= factor
        if value < TINY:
            break
        out[g] = value
        g += by
    while g != hi:
        out[g] = 0.0
        g += by


@_helper()
def _toeplitz(dens: np.ndarray, at: int, x: np.ndarray, out: np.ndarray, out_at: int) -> None:
    """out[out_at + h] = sum_g dens[at + G - 1 - h + g] x_g, dens[at : at + 2 G - 1] symmetric about
    its middle (as :func:`_densities` writes it), x >= 0: 4 LANES outputs at a time
    (:func:`_toeplitz_block`), or, where G is no multiple of 4 LANES, each output a sum.

    Every term is >= 0, so a sum in any order is within (G - 1) u of the exact sum, u =
    2^-53, relative, and each product (unless fused) within u: each out_h within G u = 7.1e-15
    (G = 64) of the exact out_h, relative, and two orders within twice that of each other
    (while the products stay above 2^-1022, where they are exact to u relative; a posterior
    raised to its floor of 1e-250 keeps every out_h far above the underflowing terms)."""
    g_n = x.size
    if g_n % (4 * LANES):
        for h in range(g_n):
            acc, o = 0.0, at + g_n - 1 - h
            for g in range(g_n):
                acc += x[g] * dens[np.uintp(o + g)]
            out[out_at + h] = acc
        return
    for h in range(0, g_n, 4 * LANES):
        _toeplitz_block(dens, at + g_n - 1 + h, x, out, out_at + h)


@_helper()
def _toeplitz_block(dens: np.ndarray, at: int, x: np.ndarray, out: np.ndarray, h: int) -> None:
    """out[h : h + 4 LANES] of :func:`_toeplitz` as 4 vectors of sums, out[h + i] = sum_g
    dens[at + i - g] x_g (at: the slot's G - 1 + its first output; dens symmetric). Source g needs the densities from o_g +
    k LANES, k < 4, o_g = G - 1 + h - g, and source g + LANES those from o_g + (k - 1) LANES:
    along each residue class of g mod LANES a vector is loaded once and handed down, one
    load, a broadcast and 4 fused multiply-adds a source (not the 5 loads, 4 products and 4
    sums of the scalar loop). Two classes at a time, r (into a) and r + 1 (into b): 8 chains
    of sums, none waiting on the last's result; each output is a + b, a the sum of the even
    classes' terms in order (g = 0, 8, .., 56, then 2, 10, ..), b the odd classes'. Written
    out 4 sources a class at a time, so that handing a vector down is a new name, not a
    register copy (which would take the ports the multiply-adds need)."""
    g_n, w = x.size, LANES
    a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = _zero()
    for r in range(0, w, 2):
        o = at - r
        d0, d1 = _load(dens, o), _load(dens, o + w)
        d2, d3 = _load(dens, o + 2 * w), _load(dens, o + 3 * w)
        e0, e1 = _load(dens, o - 1), _load(dens, o - 1 + w)
        e2, e3 = _load(dens, o - 1 + 2 * w), _load(dens, o - 1 + 3 * w)
        for g in range(r, g_n, 4 * w):
            xa, xb = _splat_at(x, g), _splat_at(x, g + 1)  # window (d0, d1, d2, d3)
            a0, a1, a2, a3 = _fma(xa, d0, a0), _fma(xa, d1, a1), _fma(xa, d2, a2), _fma(xa, d3, a3)
            b0, b1, b2, b3 = _fma(xb, e0, b0), _fma(xb, e1, b1), _fma(xb, e2, b2), _fma(xb, e3, b3)
            n0, m0 = _load(dens, o - w), _load(dens, o - 1 - w)
            xa, xb = _splat_at(x, g + w), _splat_at(x, g + w + 1)  # (n0, d0, d1, d2)
            a0, a1, a2, a3 = _fma(xa, n0, a0), _fma(xa, d0, a1), _fma(xa, d1, a2), _fma(xa, d2, a3)
            b0, b1, b2, b3 = _fma(xb, m0, b0), _fma(xb, e0, b1), _fma(xb, e1, b2), _fma(xb, e2, b3)
            n1, m1 = _load(dens, o - 2 * w), _load(dens, o - 1 - 2 * w)
            xa, xb = _splat_at(x, g + 2 * w), _splat_at(x, g + 2 * w + 1)  # (n1, n0, d0, d1)
            a0, a1, a2, a3 = _fma(xa, n1, a0), _fma(xa, n0, a1), _fma(xa, d0, a2), _fma(xa, d1, a3)
            b0, b1, b2, b3 = _fma(xb, m1, b0), _fma(xb, m0, b1), _fma(xb, e0, b2), _fma(xb, e1, b3)
            n2, m2 = _load(dens, o - 3 * w), _load(dens, o - 1 - 3 * w)
            xa, xb = _splat_at(x, g + 3 * w), _splat_at(x, g + 3 * w + 1)  # (n2, n1, n0, d0)
            a0, a1, a2, a3 = _fma(xa, n2, a0), _fma(xa, n1, a1), _fma(xa, n0, a2), _fma(xa, d0, a3)
            b0, b1, b2, b3 = _fma(xb, m2, b0), _fma(xb, m1, b1), _fma(xb, m0, b2), _fma(xb, e0, b3)
            o -= 4 * w  # the next 4 sources' window (read at 0 after the last: not used)
            d0, d1, d2, d3 = _load(dens, max(o, 0)), n2, n1, n0
            e0, e1, e2, e3 = _load(dens, max(o - 1, 0)), m2, m1, m0
    _store(out, h, _add(a0, b0))
    _store(out, h + w, _add(a1, b1))
    _store(out, h + 2 * w, _add(a2, b2))
    _store(out, h + 3 * w, _add(a3, b3))


@_helper(fastmath={"reassoc"})
def _mix(row: np.ndarray, at: int, jump: float, other: np.ndarray) -> None:
    """row[at : at + G] = (1 - jump) row + jump other[at : at + G] / its total (a sum on
    vectors)."""
    g_n = other.size // 2
    total = 0.0
    for g in range(g_n):
        total += other[np.uintp(at + g)]
    scale = jump / total
    for g in range(g_n):
        u = np.uintp(at + g)
        row[u] = (1.0 - jump) * row[u] + scale * other[u]


@_helper(fastmath={"reassoc"})
def _dot_at(x: np.ndarray, at: int, y: np.ndarray) -> float:
    """x[at : at + y.size] . y, on vectors."""
    acc = 0.0
    for g in range(y.size):
        acc += x[np.uintp(at + g)] * y[g]
    return acc


@njit(cache=True, error_model="numpy")
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
    for n in range(min(AHEAD, rows.size)):
        _prefetch_row(weights, rows, n)
    for n in range(rows.size):
        _prefetch_row(weights, rows, n + AHEAD)
        _bayes(post[n], 0, likelihood, which[n], weights, rows[n], floor)


@_helper(fastmath={"reassoc"})
def _bayes(
    w: np.ndarray, at: int, likelihood: np.ndarray, line: int, weights: np.ndarray, i: int,
    floor: float,
) -> None:  # fmt: skip
    """weights[i] = w[at : at + G] x likelihood[line] normalised (its sum on vectors), each
    cell raised to at least ``floor``."""
    g_n = weights.shape[1]
    acc = 0.0
    for g in range(g_n):
        acc += likelihood[line, g] * w[np.uintp(at + g)]
    scale = 1.0 / acc
    for g in range(g_n):
        weights[i, g] = max((likelihood[line, g] * w[np.uintp(at + g)]) * scale, floor)
