"""``basis_track``'s row loops, compiled with numba: each posterior row of a batch read from
the state by index, moved, blurred, mixed with the redrawn Gaussian, valued and updated in
one pass, element by element, where numpy ran a dozen passes over (rows, G) arrays. The
Gaussians are running products (:func:`_gauss_cells`), the sums reassociated as numpy's own
products are (``fastmath={"reassoc"}``), and the blur (:func:`_toeplitz`) runs on vectors
of LANES doubles with fused multiply-adds, in an order of its own (its docstring bounds the
difference: some 1e-14 relative a cell). Imported on first use: ``import numba`` costs a
fraction of a second, and ``cache=True`` keeps the compiled loops on disk beside this file
(numba's user cache directory where that is not writable). ``basis_memory``'s and
``basis_context``'s loops are :mod:`memory_loops`'.

The loops read the state's rows by index, in no order the CPU can guess: each asks for the
row AHEAD rows on (a prefetch, :func:`_prefetch`) before working on its own, so the reads
from memory overlap the arithmetic instead of stalling it (the same numbers). The prefetch
and the blur's vector operations are numba intrinsics (LLVM instructions written out),
defined here beside the loops that use them: numba's disk cache knows a compiled loop's own
file only, and an intrinsic is compiled into its caller.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

AHEAD = 4  # rows prefetched ahead of the one being worked on
LANES = 8  # doubles a vector of the blur: one 512-bit register (two 256-bit, four 128-bit)
_VECTOR = ir.VectorType(ir.DoubleType(), LANES)


def _prefetch_typed(typingctx: Any, array: Any, i: Any, j: Any) -> tuple[Any, Any]:
    """_prefetch(array, i, j): ask the CPU to bring the cache line of array[i, j] into its
    caches (LLVM's prefetch: no load, nothing waits for it, no fault at any address)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        kind = signature.args[0]
        data = context.make_array(kind)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, kind, data, args[1:])
        byte = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte, i32, i32, i32]), "llvm.prefetch"
        )
        # for a read (0), to keep in every cache level (3), data (1)
        builder.call(fn, [builder.bitcast(ptr, byte), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.void(array, i, j), codegen


_prefetch: Any = intrinsic(_prefetch_typed)


@njit(error_model="numpy")
def _prefetch_row(array: np.ndarray, rows: np.ndarray, n: int) -> None:
    """Prefetch every cache line of array[rows[n]] if there is such a row."""
    if n < rows.size:
        last = array.shape[1] - 1
        for j in range(0, last, 8):
            _prefetch(array, rows[n], j)
        _prefetch(array, rows[n], last)


class _Lanes(types.Type):
    """LANES doubles as one LLVM vector value, held in registers (numba has no such type)."""

    def __init__(self) -> None:
        super().__init__(name=f"lanes{LANES}xf64")


_LANES = _Lanes()


@register_model(_Lanes)
class _LanesModel(models.PrimitiveModel):
    def __init__(self, dmm: Any, fe_type: Any) -> None:
        super().__init__(dmm, fe_type, _VECTOR)


def _contiguous(array: Any) -> bool:
    """Whether ``array`` is a 1-d contiguous float64 array (what _load and _store take)."""
    kind = isinstance(array, types.Array) and array.ndim == 1 and array.layout == "C"
    return kind and array.dtype == types.float64


def _lanes_at(context: Any, builder: Any, kind: Any, array: Any, i: Any) -> Any:
    """A pointer to array[i : i + LANES] as one vector (unchecked: the caller's bounds)."""
    data = context.make_array(kind)(context, builder, array)
    ptr = cgutils.get_item_pointer(context, builder, kind, data, [i])
    return builder.bitcast(ptr, _VECTOR.as_pointer())


def _load_typed(typingctx: Any, array: Any, i: Any) -> tuple[Any, Any] | None:
    """_load(array, i): array[i : i + LANES] of a contiguous 1-d float64 array."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.load(_lanes_at(context, builder, signature.args[0], *args), align=8)

    return (_LANES(array, i), codegen) if _contiguous(array) else None


def _store_typed(typingctx: Any, array: Any, i: Any, v: Any) -> tuple[Any, Any] | None:
    """_store(array, i, v): array[i : i + LANES] = v."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        ptr = _lanes_at(context, builder, signature.args[0], args[0], args[1])
        builder.store(args[2], ptr, align=8)
        return context.get_dummy_value()

    return (types.void(array, i, v), codegen) if _contiguous(array) else None


def _splat_typed(typingctx: Any, x: Any) -> tuple[Any, Any]:
    """_splat(x): x in every lane."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        one = builder.insert_element(ir.Constant(_VECTOR, ir.Undefined), args[0], ir.IntType(32)(0))
        every = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)
        return builder.shuffle_vector(one, ir.Constant(_VECTOR, ir.Undefined), every)

    return _LANES(types.float64), codegen


def _fma_typed(typingctx: Any, x: Any, y: Any, acc: Any) -> tuple[Any, Any]:
    """_fma(x, y, acc): x y + acc lane by lane, fused (one rounding) where the CPU has a
    fused multiply-add, a product and a sum where it has none (LLVM's fmuladd)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        kind = ir.FunctionType(_VECTOR, [_VECTOR] * 3)
        name = f"llvm.fmuladd.v{LANES}f64"
        return builder.call(cgutils.get_or_insert_function(builder.module, kind, name), args)

    return _LANES(_LANES, _LANES, _LANES), codegen


def _add_typed(typingctx: Any, x: Any, y: Any) -> tuple[Any, Any]:
    """_add(x, y): x + y lane by lane."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.fadd(*args)

    return _LANES(_LANES, _LANES), codegen


def _zero_typed(typingctx: Any) -> tuple[Any, Any]:
    """_zero(): 0 in every lane."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return ir.Constant(_VECTOR, [0.0] * LANES)

    return _LANES(), codegen


_load: Any = intrinsic(_load_typed)
_store: Any = intrinsic(_store_typed)
_splat: Any = intrinsic(_splat_typed)
_fma: Any = intrinsic(_fma_typed)
_add: Any = intrinsic(_add_typed)
_zero: Any = intrinsic(_zero_typed)


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
    sig, ez, square = np.empty(g_n), np.empty(g_n), theta * theta
    for n in range(min(AHEAD, rows.size)):
        _prefetch_row(weights, rows, n)
    for n in range(rows.size):
        _prefetch_row(weights, rows, n + AHEAD)
        w = weights[rows[n]]
        _sigmoids(theta, moved[n], var[n], ez, sig)
        pn = _dot(w, sig)
        if jump[n] != 0.0:
            _sigmoids(theta, moved[n], var[n] + jump_var, ez, sig)
            pn = (1.0 - jump[n]) * pn + jump[n] * _dot(w, sig)
        p[n] = pn
        moments[n, 0], moments[n, 1] = _dot(w, theta), _dot(w, square)


@njit(error_model="numpy")
def _sigmoids(theta: np.ndarray, shift: float, var: float, ez: np.ndarray, out: np.ndarray) -> None:
    """out_g = 1 / (1 + e^-z_g), z_g = (theta_g + shift) / sqrt(1 + pi var / 8), on an evenly
    spaced grid: e^-z_g as a running product, e^-z_0 times e^(-spacing scale) g times for the
    first 8 cells and each cell the one 8 before times its 8th power (some 17 roundings at
    most, the product vectorised by 8); each cell's own exponential where the ends leave
    e^+-700 (no product near overflow)."""
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
    for g in range(out.size):
        out[g] = 1.0 / (1.0 + ez[g])


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

    * moved by shift[n] / spacing grid steps: each cell's mass spread uniformly over the
      cell and moved, the cumulative mass (0 below the grid, the total above it) read at
      every cell edge moved back, interpolated by the move's fraction;
    * blurred by N(0, var[n]) unless that is the identity (the density one cell away
      underflows to 0): out_h = sum_g K[h, g] w_g / norm_g, K[h, g] = d_|h - g| the
      Gaussian's density at the offset, norm_g = sum_h K[h, g] as two partial sums of d;
    * a row with jump != 0 mixed with the redrawn posterior, (1 - jump) out + jump
      redrawn: the Gaussian on the grid with the old posterior's mean (moments[n, 0]) moved
      by shift[n] and its variance (moments[n, 1] - mean^2) widened by var[n] + jump_var,
      normalised.

    The Gaussians' cells are running products (:func:`_gauss_cells`).
    """
    n_rows, g_n = rows.size, out.shape[1]
    spacing = theta[1] - theta[0]
    near = spacing * spacing
    ext = np.zeros(3 * g_n + 3)  # ext[g_n + 1 + j]: the mass below edge j, |j| <= 2 G + 1
    edges = np.empty(g_n + 1)
    dens, norm, x = np.empty(2 * g_n - 1), np.empty(g_n), np.empty(g_n)
    for n in range(min(AHEAD, n_rows)):
        _prefetch_row(weights, rows, n)
    update = likelihood.shape[0] > 0
    for n in range(n_rows):
        _prefetch_row(weights, rows, n + AHEAD)
        row = out[0] if update else out[n]
        q = np.exp(-near / (2.0 * max(var[n], 1e-12)))  # the density one cell away
        total = _masses(weights[rows[n]], q, ext[g_n + 2 : 2 * g_n + 2], dens, norm)
        ext[2 * g_n + 2 :] = total
        back = -(shift[n] / spacing)
        whole = np.floor(back)
        start = int(min(max(whole, -(g_n + 1)), g_n)) + g_n + 1
        _interpolate(ext[start : start + g_n + 2], back - whole, edges)
        edges[0], edges[g_n] = 0.0, total
        _difference(edges, row)
        if q > 0.0:
            for g in range(g_n // 2):
                a, b = norm[g], norm[g_n - 1 - g]
                norm[g], norm[g_n - 1 - g] = a + b, b + a
            if g_n % 2:
                norm[g_n // 2] += norm[g_n // 2]
            _normalised(row, norm, 1.0, x)
            _toeplitz(dens, x, row)
        if jump[n] != 0.0:
            _redrawn(moments[n], shift[n], var[n], jump_var, theta, x)
            _mix(row, jump[n], x, _sum(x))
        values[n] = _dot(row, sig)
        if update:
            _bayes(row, likelihood[which[n]], weights[rows[n]], floor)


@njit(error_model="numpy")
def _masses(w: np.ndarray, q: float, cum: np.ndarray, dens: np.ndarray, norm: np.ndarray) -> float:
    """The running sum cum of w (its total returned) and, if q > 0, the blur's densities
    dens[G - 1 +- k] = q^(k^2) (a running product, as :func:`_gauss_cells`) and their running
    sum norm, in one loop: three chains of dependent additions and products, each waiting
    on its last result, that the CPU runs side by side (the same numbers as three loops)."""
    g_n = w.size
    acc = w[0]
    cum[0] = acc
    if q > 0.0:
        value, ratio, factor, mass = 1.0, q, q * q, 1.0
        dens[g_n - 1], norm[0] = value, mass
        for g in range(1, g_n):
            acc += w[g]
            cum[g] = acc
            value *= ratio
            ratio *= factor
            dens[g_n - 1 + g] = value
            dens[g_n - 1 - g] = value
            mass += value
            norm[g] = mass
    else:
        for g in range(1, g_n):
            acc += w[g]
            cum[g] = acc
    return acc


@njit(error_model="numpy")
def _redrawn(
    moments: np.ndarray, shift: float, var: float, widen: float, theta: np.ndarray,
    out: np.ndarray,
) -> None:  # fmt: skip
    """The Gaussian on the grid with mean moments[0] + shift and variance moments[1] -
    moments[0]^2 + var + widen, 1 at the cell nearest its mean (unnormalised)."""
    mean = moments[0]
    spread = 2.0 * (moments[1] - mean * mean + var + widen)
    centre, spacing = mean + shift, theta[1] - theta[0]
    top = int(min(max(np.round((centre - theta[0]) / spacing), 0.0), theta.size - 1.0))
    t = np.exp(-2.0 * spacing * spacing / spread)
    lead = 2.0 * (theta[top] - centre) * spacing
    out[top] = 1.0
    _gauss_cells(1.0, np.exp(-(lead + spacing * spacing) / spread), t, out, top + 1, out.size, 1)
    _gauss_cells(1.0, np.exp(-(spacing * spacing - lead) / spread), t, out, top - 1, -1, -1)


@njit(error_model="numpy")
def _gauss_cells(
    value: float, ratio: float, factor: float, out: np.ndarray, lo: int, hi: int, by: int
) -> None:
    """A Gaussian's cells out[lo], out[lo + by], .. (up to hi) as a running product: each
    the one before times ``ratio``, which is multiplied by ``factor`` a cell (the ratio of
    neighbouring cells of e^(-c k^2) is e^(-c (2 k - 1)), each e^(-2 c) times the last)."""
    for g in range(lo, hi, by):
        value *= ratio
        ratio *= factor
        out[g] = value


@njit(error_model="numpy")
def _cumsum(x: np.ndarray, out: np.ndarray) -> float:
    acc = 0.0
    for g in range(x.size):
        acc += x[g]
        out[g] = acc
    return acc


@njit(error_model="numpy")
def _interpolate(below: np.ndarray, frac: float, out: np.ndarray) -> None:
    """out[k] = below[k] (1 - frac) + below[k + 1] frac."""
    for k in range(out.size):
        out[k] = below[k] * (1.0 - frac) + below[k + 1] * frac


@njit(error_model="numpy")
def _difference(edges: np.ndarray, out: np.ndarray) -> None:
    for h in range(out.size):
        out[h] = edges[h + 1] - edges[h]


@njit(error_model="numpy")
def _normalised(w: np.ndarray, norm: np.ndarray, centre: float, out: np.ndarray) -> None:
    for g in range(w.size):
        out[g] = w[g] / (norm[g] - centre)


@njit(error_model="numpy")
def _toeplitz(dens: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out_h = sum_g dens[G - 1 - h + g] x_g, dens (2 G - 1,) symmetric about G - 1 (as
    :func:`_masses` writes it), x >= 0: 4 LANES outputs at a time (:func:`_toeplitz_block`),
    or, where G is no multiple of 4 LANES, each output a dot product.

    Every term is >= 0, so a sum in any order is within (G - 1) u of the exact sum, u =
    2^-53, relative, and each product (unless fused) within u: each out_h within G u = 7.1e-15
    (G = 64) of the exact out_h, relative, and two orders within twice that of each other
    (while the products stay above 2^-1022, where they are exact to u relative; a posterior
    raised to its floor of 1e-250 keeps every out_h far above the underflowing terms)."""
    g_n = x.size
    if g_n % (4 * LANES):
        for h in range(g_n):
            out[h] = _dot(x, dens[g_n - 1 - h : 2 * g_n - 1 - h])
        return
    for h in range(0, g_n, 4 * LANES):
        _toeplitz_block(dens, x, h, out)


@njit(error_model="numpy")
def _toeplitz_block(dens: np.ndarray, x: np.ndarray, h: int, out: np.ndarray) -> None:
    """out[h : h + 4 LANES] of :func:`_toeplitz` as 4 vectors of sums, out[h + i] = sum_g
    dens[G - 1 + h + i - g] x_g (dens symmetric). Source g needs the densities from o_g +
    k LANES, k < 4, o_g = G - 1 + h - g, and source g + LANES those from o_g + (k - 1) LANES:
    along each residue class of g mod LANES a vector is loaded once and handed down, one
    load, a broadcast and 4 fused multiply-adds a source (not the 5 loads, 4 products and 4
    sums of the scalar loop). Two classes at a time, r (into a) and r + 1 (into b): 8 chains
    of sums, none waiting on the last's result; each output is a + b, a the sum of the even
    classes' terms in order (g = 0, 8, .., 56, then 2, 10, ..), b the odd classes'."""
    g_n, w = x.size, LANES
    a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = _zero()
    for r in range(0, w, 2):
        o = g_n - 1 + h - r
        d0, d1 = _load(dens, o), _load(dens, o + w)
        d2, d3 = _load(dens, o + 2 * w), _load(dens, o + 3 * w)
        e0, e1 = _load(dens, o - 1), _load(dens, o - 1 + w)
        e2, e3 = _load(dens, o - 1 + 2 * w), _load(dens, o - 1 + 3 * w)
        for g in range(r, g_n, w):
            xa, xb = _splat(x[g]), _splat(x[g + 1])
            a0, a1, a2, a3 = _fma(xa, d0, a0), _fma(xa, d1, a1), _fma(xa, d2, a2), _fma(xa, d3, a3)
            b0, b1, b2, b3 = _fma(xb, e0, b0), _fma(xb, e1, b1), _fma(xb, e2, b2), _fma(xb, e3, b3)
            if g + w < g_n:
                o -= w
                d0, d1, d2, d3 = _load(dens, o), d0, d1, d2
                e0, e1, e2, e3 = _load(dens, o - 1), e0, e1, e2
    _store(out, h, _add(a0, b0))
    _store(out, h + w, _add(a1, b1))
    _store(out, h + 2 * w, _add(a2, b2))
    _store(out, h + 3 * w, _add(a3, b3))


@njit(error_model="numpy")
def _mix(row: np.ndarray, jump: float, other: np.ndarray, total: float) -> None:
    for g in range(row.size):
        row[g] = (1.0 - jump) * row[g] + jump * (other[g] / total)


@njit(fastmath={"reassoc"}, error_model="numpy")
def _sum(x: np.ndarray) -> float:
    acc = 0.0
    for g in range(x.size):
        acc += x[g]
    return acc


@njit(fastmath={"reassoc"}, error_model="numpy")
def _dot(x: np.ndarray, y: np.ndarray) -> float:
    acc = 0.0
    for g in range(x.size):
        acc += x[g] * y[g]
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
        _bayes(post[n], likelihood[which[n]], weights[rows[n]], floor)


@njit(error_model="numpy")
def _bayes(w: np.ndarray, lik: np.ndarray, dst: np.ndarray, floor: float) -> None:
    """dst = w x lik normalised (a sum in order), each cell raised to at least ``floor``."""
    acc = 0.0
    for g in range(w.size):
        dst[g] = lik[g] * w[g]
        acc += dst[g]
    for g in range(w.size):
        dst[g] = max(dst[g] / acc, floor)
