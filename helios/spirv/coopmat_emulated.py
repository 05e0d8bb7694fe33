"""Cooperative matrices lowered to plain SPIR-V, with the same semantics at subgroup scope, for devices
without matrix units (lavapipe in the GPU profile, or HELIOS_COOPMAT=emulate): the matrix-unit kernels then
run end to end, tiling, staging, barriers and epilogues included, and are checked against numpy.

Representation: an M x N matrix is its row-major elements e = 0 .. M*N-1; lane l of a subgroup of S lanes
holds elements e = l + S*j in slot j of an array of f32 (f16 and bf16 elements are kept as the f32 values they
represent, rounded to their type). S is read from the SubgroupSize builtin at run time; the array has
ceil(M*N / 4) slots, enough for any subgroup of at least MIN_SUBGROUP lanes. Load and store touch only the
lane's own elements; MulAdd first gathers both operands whole into every lane with subgroup broadcasts at
uniform indices (the loop over elements is the same in every lane), then computes the lane's own elements of
the result in f32. Like the real instructions, every op must be reached by the whole subgroup.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from helios.spirv.grammar import Op
from helios.spirv.memory import LocalArray, bf16_bits
from helios.spirv.types import ScalarType, SpirvError, f16, f32, i32, u16, u32
from helios.spirv.values import Value

if TYPE_CHECKING:
    from helios.spirv.builder import KernelBuilder
    from helios.spirv.coopmat import CoopMatType
    from helios.spirv.memory import BufferView
    from helios.spirv.module import Module

MIN_SUBGROUP = 4  # the smallest subgroup the slot array is sized for


def slots(t: CoopMatType) -> int:
    """Slots per lane: ceil(rows * cols / MIN_SUBGROUP)."""
    return -(-t.rows * t.cols // MIN_SUBGROUP)


def type_id(m: Module, t: CoopMatType) -> int:
    """The f32 slot array that holds a lane's share of a t."""
    if not t.elem.is_float or t.elem.width > 32:
        raise SpirvError(f"emulated cooperative matrices hold f16, bf16 or f32 elements, not {t.elem.name}")
    return m.type_array(m.type_of(f32), m.constant(u32, slots(t)))


def round_to(b: KernelBuilder, x: Value, elem: ScalarType) -> Value:
    """The f32 x rounded to the nearest value of elem (nearest even), as an f32."""
    if elem == f32:
        return x
    if elem.name == "bf16":
        return b.bitcast(bf16_bits(b, x) << 16, f32)
    # f16 and the fp16 storage type: the IEEE half. NoContraction (exact) keeps a compiler from folding the round
    # trip away as an "inexact" identity (Mesa's NIR does, and lavapipe then skips the rounding).
    half = b.cast(x, f16)
    back = b.cast(half, f32)
    for v in (half, back):
        b.m.decorate(v.id, "NoContraction")
    return back


def _u32(b: KernelBuilder, x) -> Value:
    v = b._as_index(x)
    return b.bitcast(v, u32) if v.type == i32 else v


def _spill(b: KernelBuilder, mat: Value) -> LocalArray:
    """mat's slots in a function-local array, to index them."""
    arr = b.local_array(f32, slots(mat.type))
    b._emit(Op.Store, arr.var, mat.id)
    return arr


def _gather(b: KernelBuilder, arr: LocalArray, t: CoopMatType) -> Value:
    """The matrix of type t whose slots are arr."""
    return Value(b, b._op_id(Op.Load, arr.array_type, arr.var), t)


def _read(b: KernelBuilder, view: BufferView, index: Value, elem: ScalarType) -> Value:
    v = view[index]
    if v.type == u16:  # raw bf16 bits (a u16 array staging bf16 operands)
        return b.bitcast(b.cast(v, u32) << 16, f32)
    return b.cast(v, f32)  # f32 as is; f16 widened exactly; bf16/fp16 views already load as f32


def _write(b: KernelBuilder, view: BufferView, index: Value, x: Value) -> None:
    if view.elem == u16:
        view[index] = b.cast(b.bitcast(x, u32) >> 16, u16)
    elif view.elem == f16:
        view[index] = b.cast(x, f16)
    else:
        view[index] = x  # f32 views; bf16/fp16 views round (exactly: x is already of their type)


@contextmanager
def _own_elements(b: KernelBuilder, t: CoopMatType) -> Iterator[tuple[Value, Value, Value]]:
    """A loop over the lane's elements of t; the body sees (slot j, row, col)."""
    n = t.rows * t.cols
    lane, size = b.subgroup_local_id(), b.subgroup_size()
    with b.for_range(0, (size + (n - 1)) / size) as j:
        e = lane + size * j
        with b.if_(e < n):
            yield j, e / t.cols, e % t.cols


def _element_offset(row: Value, col: Value, stride: Value, layout: str) -> Value:
    return row * stride + col if layout == "row" else col * stride + row


def fill(b: KernelBuilder, t: CoopMatType, value) -> Value:
    v = b._as_value(value, f32)
    if not v.type.is_float or v.type.count != 1:
        raise SpirvError(f"filling a {t.name} needs a float scalar, got {v.type.name}")
    v = round_to(b, b.cast(v, f32), t.elem)
    return Value(b, b._op_id(Op.CompositeConstruct, type_id(b.m, t), *([v.id] * slots(t))), t)


def load(b: KernelBuilder, t: CoopMatType, view: BufferView, index, stride, layout: str) -> Value:
    index, stride = _u32(b, index), _u32(b, stride)
    out = b.local_array(f32, slots(t))
    with _own_elements(b, t) as (j, row, col):
        out[j] = _read(b, view, index + _element_offset(row, col, stride, layout), t.elem)
    return _gather(b, out, t)


def store(b: KernelBuilder, view: BufferView, index, mat: Value, stride, layout: str) -> None:
    index, stride = _u32(b, index), _u32(b, stride)
    own = _spill(b, mat)
    with _own_elements(b, mat.type) as (j, row, col):
        _write(b, view, index + _element_offset(row, col, stride, layout), own[j])


def _whole(b: KernelBuilder, mat: Value) -> LocalArray:
    """Every element of mat, row-major, in every lane: element e is slot e / S of lane e % S."""
    t = mat.type
    own = _spill(b, mat)
    whole = b.local_array(f32, t.rows * t.cols)
    size = b.subgroup_size()
    with b.for_range(0, t.rows * t.cols) as e:  # uniform: the same e in every lane, so broadcast may read it
        whole[e] = b.subgroup_broadcast(own[e / size], e % size)
    return whole


def muladd(b: KernelBuilder, a: Value, bmat: Value, c: Value) -> Value:
    ta, tc = a.type, c.type
    whole_a, whole_b, own_c = _whole(b, a), _whole(b, bmat), _spill(b, c)
    out = b.local_array(f32, slots(tc))
    kdim, ncols = ta.cols, tc.cols
    with _own_elements(b, tc) as (j, row, col):
        acc = b.var(f32, own_c[j])
        arow = row * kdim
        with b.for_range(0, kdim) as k:  # a loop, not unrolled: lavapipe compiles each per-lane index for long
            acc.value = b.fma(whole_a[arow + k], whole_b[col + k * ncols], acc.value)
        out[j] = round_to(b, acc.value, tc.elem)
    return _gather(b, out, tc)


def convert(b: KernelBuilder, mat: Value, t: CoopMatType) -> Value:
    src = mat.type
    if src.elem == t.elem or t.elem == f32:  # same values (f16 and bf16 widen to f32 exactly)
        return Value(b, mat.id, t)
    f32_id = b.m.type_of(f32)
    parts = []
    for k in range(slots(t)):
        x = Value(b, b._op_id(Op.CompositeExtract, f32_id, mat.id, k), f32)
        parts.append(round_to(b, x, t.elem).id)
    return Value(b, b._op_id(Op.CompositeConstruct, type_id(b.m, t), *parts), t)
