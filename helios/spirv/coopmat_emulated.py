"""Cooperative matrices lowered to plain SPIR-V, with the same semantics at subgroup scope, for devices
without matrix units (lavapipe in the GPU profile, or HELIOS_COOPMAT=emulate): the matrix-unit kernels then
run end to end, tiling, staging, barriers and epilogues included, and are checked against numpy.

Representation: an M x N matrix is its row-major elements e = 0 .. M*N-1; lane l of a subgroup of S lanes
holds elements e = l + S*j in slot j of an array of f32 (f16 and bf16 elements are kept as the f32 values they
represent, rounded to their type). S is read from the SubgroupSize builtin at run time; the array has
M*N / 4 slots, enough for any subgroup of at least MIN_SUBGROUP lanes. (Sizing it for the device's own subgroup
would be shorter, but lavapipe then keeps arrays of 128 bytes or less in registers, where every indexed access
becomes a ladder of selects: an emulated attention kernel compiled 4x slower with 32 slots than with 64.)
Load and store touch only the lane's own elements. MulAdd computes the lane's own elements of the result in f32,
reading each operand element from the lane that holds it with a subgroup shuffle: with S and N powers of two,
K = N and M*N a multiple of every subgroup size (128 at most), the slot every lane reads in one step is the same,
so one shuffle of that slot serves all. Like the real instructions, every op must be reached by the whole subgroup.

A loaded or multiplied value is built in a fresh function-local array, written before it is read as a value: a
later op that needs that value's slots reads the array itself instead of storing the value again (`_spill`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from helios.spirv.grammar import Op
from helios.spirv.memory import LocalArray, stored_value
from helios.spirv.types import ScalarType, SpirvError, f16, f32, i32, u16, u32
from helios.spirv.values import Value

if TYPE_CHECKING:
    from helios.spirv.builder import KernelBuilder
    from helios.spirv.coopmat import CoopMatType
    from helios.spirv.memory import BufferView
    from helios.spirv.module import Module

MIN_SUBGROUP = 4  # the smallest subgroup the slot array is sized for
MAX_SUBGROUP = 128  # Vulkan's largest subgroup: M*N is a multiple of it, so every lane holds as many elements


def slots(t: CoopMatType) -> int:
    """Slots per lane: rows * cols / MIN_SUBGROUP."""
    return t.rows * t.cols // MIN_SUBGROUP


def type_id(m: Module, t: CoopMatType) -> int:
    """The f32 slot array that holds a lane's share of a t."""
    if not t.elem.is_float or t.elem.width > 32:
        raise SpirvError(f"emulated cooperative matrices hold f16, bf16 or f32 elements, not {t.elem.name}")
    if t.rows * t.cols % MAX_SUBGROUP or t.cols & (t.cols - 1):
        raise SpirvError(f"an emulated {t.name} needs rows * cols a multiple of {MAX_SUBGROUP} and a power-of-two "
                         f"column count (16x16 tiles are)")
    return m.type_array(m.type_of(f32), m.constant(u32, slots(t)))


def round_to(b: KernelBuilder, x: Value, elem: ScalarType) -> Value:
    """The f32 x rounded to the nearest value of elem (nearest even), as an f32."""
    if elem == f32:
        return x
    if elem.name == "bf16":
        return stored_value(b, x, "bf16")
    # f16 and the fp16 storage type: the IEEE half. NoContraction (exact) keeps a compiler from folding the round
    # trip away as an "inexact" identity (Mesa's NIR does, and lavapipe then skips the rounding).
    return b.exact(b.cast(b.exact(b.cast(x, f16)), f32))


def _u32(b: KernelBuilder, x) -> Value:
    v = b._as_index(x)
    return b.bitcast(v, u32) if v.type == i32 else v


def _spill(b: KernelBuilder, mat: Value) -> LocalArray:
    """mat's slots in a function-local array, to index them: the array an emulated op built mat in, else a copy."""
    own = b.m.coopmat_arrays.get(mat.id)
    if own is not None:
        return own
    arr = b.local_array(f32, slots(mat.type))
    b._emit(Op.Store, arr.var, mat.id)
    return arr


def _gather(b: KernelBuilder, arr: LocalArray, t: CoopMatType) -> Value:
    """The matrix of type t whose slots are arr (which nothing writes afterwards: _spill reads it for the value)."""
    value = Value(b, b._op_id(Op.Load, type_id(b.m, t), arr.var), t)
    b.m.coopmat_arrays[value.id] = arr
    return value


def _new(b: KernelBuilder, t: CoopMatType) -> LocalArray:
    """A fresh slot array for a t (type_id refuses what the emulation cannot hold)."""
    type_id(b.m, t)
    return b.local_array(f32, slots(t))


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
    """A loop over the lane's elements of t (as many in every lane); the body sees (slot j, row, col)."""
    lane, size = b.subgroup_local_id(), b.subgroup_size()
    with b.for_range(0, (t.rows * t.cols) / size) as j:
        e = lane + size * j
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
    out = _new(b, t)
    with _own_elements(b, t) as (j, row, col):
        out[j] = _read(b, view, index + _element_offset(row, col, stride, layout), t.elem)
    return _gather(b, out, t)


def store(b: KernelBuilder, view: BufferView, index, mat: Value, stride, layout: str) -> None:
    index, stride = _u32(b, index), _u32(b, stride)
    own = _spill(b, mat)
    with _own_elements(b, mat.type) as (j, row, col):
        _write(b, view, index + _element_offset(row, col, stride, layout), own[j])


def muladd(b: KernelBuilder, a: Value, bmat: Value, c: Value) -> Value:
    ta, tc = a.type, c.type
    if ta.cols != tc.cols:
        raise SpirvError(f"emulated coopmat_muladd needs K = N (square operand tiles), got {ta.name} @ "
                         f"{bmat.type.name}")
    own_a, own_b, own_c = _spill(b, a), _spill(b, bmat), _spill(b, c)
    out = _new(b, tc)
    kdim, ncols = ta.cols, tc.cols
    size = b.subgroup_size()
    with _own_elements(b, tc) as (j, row, col):
        acc = b.var(f32, own_c[j])
        with b.for_range(0, kdim) as k:  # a loop, not unrolled: lavapipe compiles each per-lane index for long
            # A[row, k] and B[k, col]: the slot (the index / S) is the same in every lane, the lane holding it not
            ea, eb = row * kdim + k, k * ncols + col
            x = b.subgroup_shuffle(own_a[ea / size], ea % size)
            y = b.subgroup_shuffle(own_b[eb / size], eb % size)
            acc.value = b.fma(x, y, acc.value)
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
