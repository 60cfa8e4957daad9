"""Vectors of LANES doubles for ``basis_track``'s compiled loops (:mod:`loops`,
:mod:`predict_loops`, :mod:`track_loops`): numba intrinsics, LLVM instructions written out
where numba has no way to say them (a vector held in registers, its loads and stores, a
broadcast, a fused multiply-add, a lane shuffle, the reciprocal's estimate) and the
prefetch hint. An intrinsic is compiled into each loop that calls it, and numba's disk cache
knows a compiled loop's own file only: after a change here, touch those three files (or
clear their ``__pycache__``), or they keep the code compiled before.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

LANES = 8  # doubles a vector: one 512-bit register (two 256-bit, four 128-bit)
_VECTOR = ir.VectorType(ir.DoubleType(), LANES)
_I32 = ir.IntType(32)


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


def _splat_at_typed(typingctx: Any, array: Any, i: Any) -> tuple[Any, Any] | None:
    """_splat_at(array, i): array[i] in every lane (unchecked: the caller's bounds; no
    wraparound of a negative i, which numba's array[i] would test for)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        kind = signature.args[0]
        data = context.make_array(kind)(context, builder, args[0])
        value = builder.load(cgutils.get_item_pointer(context, builder, kind, data, [args[1]]))
        one = builder.insert_element(ir.Constant(_VECTOR, ir.Undefined), value, ir.IntType(32)(0))
        every = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)
        return builder.shuffle_vector(one, ir.Constant(_VECTOR, ir.Undefined), every)

    return (_LANES(array, i), codegen) if _contiguous(array) else None


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


def _reciprocal_typed(typingctx: Any, x: Any) -> tuple[Any, Any]:
    """_reciprocal(x): 1 / x lane by lane. A division of doubles takes the divider 2 cycles
    a lane, and the predictions make 64 to 128 a row; with AVX-512, VRCP14PD's estimate (14
    bits) and two Newton steps r <- r + r (1 - x r), each of two fused multiply-adds (28
    bits, then 53), within an ulp of the quotient (a prediction's row 102 -> 92 ns, this
    CPU); elsewhere the division."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        one = ir.Constant(_VECTOR, [1.0] * LANES)
        features = getattr(context.codegen(), "_tm_features", "") or ""
        if LANES != 8 or "+avx512f" not in features.split(","):
            return builder.fdiv(one, args[0])
        i8 = ir.IntType(8)
        estimate = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_VECTOR, [_VECTOR, _VECTOR, i8]),
            "llvm.x86.avx512.rcp14.pd.512",
        )  # fmt: skip
        kind = ir.FunctionType(_VECTOR, [_VECTOR] * 3)
        fma = cgutils.get_or_insert_function(builder.module, kind, "llvm.fma.v8f64")
        r = builder.call(estimate, [args[0], ir.Constant(_VECTOR, [0.0] * LANES), i8(-1)])
        minus_x = builder.fneg(args[0])
        for _ in range(2):
            r = builder.call(fma, [r, builder.call(fma, [minus_x, r, one]), r])
        return r

    return _LANES(_LANES), codegen


def _lanes_of(values: Iterable[int]) -> ir.Constant:
    """A shuffle's lane indices (0 to LANES - 1 the first vector's, LANES on the second's)."""
    return ir.Constant(ir.VectorType(_I32, LANES), list(values))


def _scan_typed(typingctx: Any, x: Any) -> tuple[Any, Any]:
    """_scan(x): the running sums along the lanes, lane i x_0 + .. + x_i (three shifted
    copies added: lane i's sum a tree, ((x_0 + x_1) + (x_2 + x_3)) + .. for lane 7)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        v, zero = args[0], ir.Constant(_VECTOR, [0.0] * LANES)
        for k in (1, 2, 4):
            shifted = _lanes_of(LANES if i < k else i - k for i in range(LANES))
            v = builder.fadd(v, builder.shuffle_vector(v, zero, shifted))
        return v

    return _LANES(_LANES), codegen


def _last_typed(typingctx: Any, x: Any) -> tuple[Any, Any]:
    """_last(x): x's last lane in every lane."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        undefined = ir.Constant(_VECTOR, ir.Undefined)
        return builder.shuffle_vector(args[0], undefined, _lanes_of([LANES - 1] * LANES))

    return _LANES(_LANES), codegen


def _reverse_typed(typingctx: Any, x: Any) -> tuple[Any, Any]:
    """_reverse(x): x's lanes in reverse order."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        undefined = ir.Constant(_VECTOR, ir.Undefined)
        return builder.shuffle_vector(args[0], undefined, _lanes_of(range(LANES - 1, -1, -1)))

    return _LANES(_LANES), codegen


def _keep_first_typed(typingctx: Any, x: Any, n: Any) -> tuple[Any, Any] | None:
    """_keep_first(x, n): x's first n lanes, 0 in the others."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        i64 = ir.IntType(64)
        kind = ir.VectorType(i64, LANES)
        count = context.cast(builder, args[1], signature.args[1], types.int64)
        splat = builder.insert_element(ir.Constant(kind, ir.Undefined), count, _I32(0))
        splat = builder.shuffle_vector(
            splat, ir.Constant(kind, ir.Undefined), _lanes_of([0] * LANES)
        )
        first = builder.icmp_signed("<", ir.Constant(kind, list(range(LANES))), splat)
        return builder.select(first, args[0], ir.Constant(_VECTOR, [0.0] * LANES))

    return (_LANES(_LANES, n), codegen) if isinstance(n, types.Integer) else None


def _plus_typed(typingctx: Any, x: Any, c: Any) -> tuple[Any, Any] | None:
    """_plus(x, c): x + c lane by lane, c a number."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        value = context.cast(builder, args[1], signature.args[1], types.float64)
        one = builder.insert_element(ir.Constant(_VECTOR, ir.Undefined), value, _I32(0))
        undefined = ir.Constant(_VECTOR, ir.Undefined)
        return builder.fadd(args[0], builder.shuffle_vector(one, undefined, _lanes_of([0] * LANES)))

    return (_LANES(_LANES, c), codegen) if isinstance(c, types.Float) else None


_prefetch: Any = intrinsic(_prefetch_typed)
_load: Any = intrinsic(_load_typed)
_store: Any = intrinsic(_store_typed)
_splat_at: Any = intrinsic(_splat_at_typed)
_fma: Any = intrinsic(_fma_typed)
_add: Any = intrinsic(_add_typed)
_zero: Any = intrinsic(_zero_typed)
_reciprocal: Any = intrinsic(_reciprocal_typed)
_scan: Any = intrinsic(_scan_typed)
_last: Any = intrinsic(_last_typed)
_reverse: Any = intrinsic(_reverse_typed)
_keep_first: Any = intrinsic(_keep_first_typed)
_plus: Any = intrinsic(_plus_typed)
