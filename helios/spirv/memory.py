"""Things a kernel reads and writes: storage buffers (and their vector views), function-local
variables and arrays, and workgroup shared arrays. Indexing loads, index assignment stores."""

from __future__ import annotations

from typing import TYPE_CHECKING

from helios.spirv.grammar import MemoryAccess, Op
from helios.spirv.types import DType, ScalarType, SpirvError, VectorType, f32, u16, u32, vec, with_count
from helios.spirv.values import Value

if TYPE_CHECKING:
    from helios.spirv.builder import KernelBuilder

ACCESS = ("r", "w", "rw")


class _Indexable:
    """Shared load/store through an access chain: subclasses give the pointer of element k."""

    b: KernelBuilder
    elem: DType

    def _pointer(self, k) -> tuple[int, DType, str]:
        """(pointer id, element type, storage class) of element k."""
        raise NotImplementedError

    def _check(self, reading: bool) -> None:
        pass

    def __getitem__(self, k) -> Value:
        self._check(reading=True)
        ptr, t, storage = self._pointer(k)
        return self.b._op(Op.Load, t, ptr, *_aligned(storage, t))

    def __setitem__(self, k, value) -> None:
        self._check(reading=False)
        ptr, t, storage = self._pointer(k)
        v = self.b._as_value(value, t)
        if v.type != t:
            raise SpirvError(f"storing a {v.type.name} into an element of type {t.name}: use b.cast")
        self.b._emit(Op.Store, ptr, v.id, *_aligned(storage, t))


def _aligned(storage: str, t: DType) -> tuple[int, ...]:
    """The memory operands of a load or store: accesses through a device address must state their alignment
    (an element of t is aligned to its size: regions start on 256 bytes and elements are packed)."""
    if storage != "PhysicalStorageBuffer":
        return ()
    return (MemoryAccess.Aligned, t.size)


def bf16_bits(b: KernelBuilder, v: Value) -> Value:
    """The bf16 bit patterns (in the low 16 bits of u32s) of f32 value(s) v, rounded to nearest even; a NaN
    stays a (quiet) NaN, never rounded into Inf."""
    bits = b.bitcast(v, with_count(u32, v.type.count))
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = ((bits & 0x7F800000).eq(0x7F800000)) & ((bits & 0x7FFFFF).ne(0))
    return b.select(nan, (bits >> 16) | 0x40, rounded)


def _per_component(b: KernelBuilder, v: Value, fn) -> Value:
    if v.type.count == 1:
        return fn(v)
    return b.vector(*(fn(v[i]) for i in range(v.type.count)))


def fp16_widen(b: KernelBuilder, bits: Value) -> Value:
    """The f32 value(s) of IEEE half bit patterns (in the low 16 bits of u32s): exact, subnormals included."""
    return _per_component(b, bits, lambda x: b.glsl("UnpackHalf2x16", x, result=vec(f32, 2)).x)


def fp16_bits(b: KernelBuilder, v: Value) -> Value:
    """The IEEE half bit patterns (low 16 bits of u32s) of f32 value(s) v, rounded to nearest even; out of
    range values become +-Inf and NaN stays NaN (GLSL PackHalf2x16)."""
    return _per_component(b, v, lambda x: b.glsl("PackHalf2x16", b.vec2(x, 0.0), result=u32))


def stored_value(b: KernelBuilder, v: Value, dtype: str) -> Value:
    """The f32 value(s) a load gives back after v is stored as `dtype` (bf16 or fp16 rounded to nearest even the way
    BufferView and helios.kernels.lib.wide store them; f32: v itself), to compute on as the unfused kernels would."""
    if dtype == "f32":
        return v
    if dtype == "bf16":
        return b.bitcast(bf16_bits(b, v) << 16, with_count(f32, v.type.count))
    if dtype == "fp16":  # each step exact (NoContraction): Mesa's NIR folds an inexact round trip away
        return _per_component(b, v, lambda x: b.exact(b.glsl(
            "UnpackHalf2x16", b.exact(b.glsl("PackHalf2x16", b.vec2(x, 0.0), result=u32)), result=vec(f32, 2))).x)
    raise SpirvError(f"stored_value: dtype must be f32, bf16 or fp16, not {dtype!r}")


class BufferView(_Indexable):
    """A storage buffer seen as an array of `elem` (a scalar, or a vector of the buffer's scalar).

    A bf16 or fp16 view stores u16 bit patterns: elements load as f32 (exactly) and f32 values store rounded
    to nearest even (NaN stays NaN)."""

    def __init__(self, buffer: Buffer, elem: DType) -> None:
        self.buffer, self.b, self.elem = buffer, buffer.b, elem
        self.widened = elem.elem.name if elem.elem.name in ("bf16", "fp16") else None
        self.stored = with_count(u16, elem.count) if self.widened else elem  # the type in buffer memory
        self._var: int | None = None

    def __getitem__(self, k) -> Value:
        if not self.widened:
            return super().__getitem__(k)
        self._check(reading=True)
        ptr, t, storage = self._pointer(k)
        b = self.b
        bits = b.cast(b._op(Op.Load, t, ptr, *_aligned(storage, t)), u32)
        if self.widened == "bf16":
            return b.bitcast(bits << 16, with_count(f32, t.count))
        return fp16_widen(b, bits)

    def __setitem__(self, k, value) -> None:
        if not self.widened:
            return super().__setitem__(k, value)
        self._check(reading=False)
        ptr, t, storage = self._pointer(k)
        b, want = self.b, with_count(f32, t.count)
        v = b._as_value(value, want)
        if v.type != want:
            raise SpirvError(f"a {self.widened} element stores from {want.name}, got {v.type.name}: use b.cast")
        bits = bf16_bits(b, v) if self.widened == "bf16" else fp16_bits(b, v)
        self.b._emit(Op.Store, ptr, b.cast(bits, u16).id, *_aligned(storage, t))

    @property
    def var(self) -> int:
        """The SPIR-V variable of this view (created on first use)."""
        if self._var is None:
            m, t = self.b.m, self.stored
            if t.elem.width == 16:
                m.require_capability("StorageBuffer16BitAccess")
            arr = m.type_runtime_array(m.type_of(t), t.size)
            block = m.type_block((arr,), (0,))
            suffix = "" if isinstance(t, ScalarType) else f"_vec{t.count}"
            self._var = m.global_variable("StorageBuffer", block, f"buf{self.buffer.binding}{suffix}")
            m.decorate(self._var, "DescriptorSet", 0)
            m.decorate(self._var, "Binding", self.buffer.binding)
            if self.buffer.access == "r":
                m.decorate(self._var, "NonWritable")
            elif self.buffer.access == "w":
                m.decorate(self._var, "NonReadable")
        return self._var

    def _check(self, reading: bool) -> None:
        access = self.buffer.access
        if reading and access == "w":
            raise SpirvError(f"buffer binding {self.buffer.binding} is write-only ('w') but is read")
        if not reading and access == "r":
            raise SpirvError(f"buffer binding {self.buffer.binding} is read-only ('r') but is written")

    def _pointer(self, k) -> tuple[int, DType, str]:
        b = self.b
        idx = b._as_index(k)
        if self.buffer.address is not None:
            return self._address_pointer(idx)
        ptr_t = b.m.type_pointer("StorageBuffer", b.m.type_of(self.stored))
        zero = b.m.constant(u32, 0)
        ptr = b._op_id(Op.AccessChain, ptr_t, self.var, zero, idx.id)
        return ptr, self.stored, "StorageBuffer"


    def _address_pointer(self, idx: Value) -> tuple[int, DType, str]:
        """Element idx through the binding's device address (pushed as two u32 words): on lavapipe a load
        whose address differs per invocation becomes one gather instead of a bounds-checked scalar loop."""
        b, m = self.b, self.b.m
        m.require_capability("PhysicalStorageBufferAddresses")
        if self.stored.elem.width == 16:
            m.require_capability("StorageBuffer16BitAccess")
        ptr_t = m.type_pointer("PhysicalStorageBuffer", m.type_of(self.stored))
        if ptr_t not in b._strided_pointers:  # OpPtrAccessChain steps by the pointer type's ArrayStride
            m.decorate(ptr_t, "ArrayStride", self.stored.size)
            b._strided_pointers.add(ptr_t)
        lo, hi = self.buffer.address
        base = b._op_id(Op.Bitcast, ptr_t, b.vector(lo, hi).id)
        return b._op_id(Op.PtrAccessChain, ptr_t, base, idx.id), self.stored, "PhysicalStorageBuffer"


class Buffer(BufferView):
    """A storage buffer binding (descriptor set 0). `buf[i]` indexes scalars; `buf.vec4[i]` indexes
    vec4s of the same memory (element i covers scalars 4i..4i+3); `buf.view_as(t)` sees it as t's."""

    def __init__(self, b: KernelBuilder, binding: int, dtype: ScalarType, access: str,
                 address: tuple[Value, Value] | None = None) -> None:
        self.b, self.binding, self.dtype, self.access = b, binding, dtype, access
        self.address = address  # (low, high) u32 push constants of its device address, when addressed
        self.views: dict[DType, BufferView] = {dtype: self}
        BufferView.__init__(self, self, dtype)

    def view_as(self, elem: DType) -> BufferView:
        """This buffer's memory as an array of elem, any non-bool scalar or vector type: element i is
        bytes [i * size, (i + 1) * size) of the binding. `buf.view_as(vec(u64, 2))[i]` loads the 16 bytes
        of four f32s as two 64-bit words (b.bitcast turns them back into a vec4<f32>)."""
        if not isinstance(elem, ScalarType | VectorType) or elem.is_bool:
            raise SpirvError(f"a buffer can be viewed as f32, f16, i32, u32 or u64 scalars or vectors, not {elem!r}")
        if elem not in self.views:
            self.views[elem] = BufferView(self, elem)
        return self.views[elem]

    def view(self, n: int) -> BufferView:
        """The view of this buffer as vectors of n of its own elements (n = 1: scalars)."""
        return self.view_as(with_count(self.dtype, n))

    @property
    def vec2(self) -> BufferView:
        return self.view(2)

    @property
    def vec4(self) -> BufferView:
        return self.view(4)

    def used_views(self) -> list[BufferView]:
        """The views the kernel touched: other element types first, then its own by component count."""
        used = [v for v in self.views.values() if v._var is not None]
        return sorted(used, key=lambda v: (v.elem.elem == self.dtype, v.elem.count, v.elem.name))


class Var:
    """A function-local mutable variable: `v.value` loads, `v.value = x` stores, `v += x` works."""

    def __init__(self, b: KernelBuilder, dtype: DType, ptr: int) -> None:
        self.b, self.type, self.ptr = b, dtype, ptr

    def load(self) -> Value:
        return self.b._op(Op.Load, self.type, self.ptr)

    def store(self, value) -> None:
        v = self.b._as_value(value, self.type)
        if v.type != self.type:
            raise SpirvError(f"storing a {v.type.name} into a variable of type {self.type.name}: use b.cast")
        self.b._emit(Op.Store, self.ptr, v.id)

    @property
    def value(self) -> Value:
        return self.load()

    @value.setter
    def value(self, v) -> None:
        self.store(v)

    def __iadd__(self, o):
        self.store(self.load() + o)
        return self

    def __isub__(self, o):
        self.store(self.load() - o)
        return self

    def __imul__(self, o):
        self.store(self.load() * o)
        return self

    def __itruediv__(self, o):
        self.store(self.load() / o)
        return self

    def __ior__(self, o):
        self.store(self.load() | o)
        return self

    def __iand__(self, o):
        self.store(self.load() & o)
        return self

    def __repr__(self) -> str:
        return f"Var(%{self.ptr}: {self.type.name})"


class _Array(_Indexable):
    """An array variable (function-local or workgroup-shared) of `length` elements."""

    storage = ""

    def __init__(self, b: KernelBuilder, elem: DType, length, name: str) -> None:
        self.b, self.elem = b, elem
        m = b.m
        if isinstance(length, Value):
            length_id = length.id  # a specialization constant
            self.length: int | Value = length
        else:
            if int(length) < 1:
                raise SpirvError(f"array length must be at least 1, got {length}")
            length_id = m.constant(u32, int(length))
            self.length = int(length)
        self.array_type = m.type_array(m.type_of(elem), length_id)
        self.var = self._declare(name)

    def _declare(self, name: str) -> int:
        raise NotImplementedError

    def _pointer(self, k) -> tuple[int, DType, str]:
        b = self.b
        if isinstance(k, int) and isinstance(self.length, int) and not 0 <= k < self.length:
            raise SpirvError(f"index {k} out of range for an array of {self.length}")
        idx = b._as_index(k)
        ptr_t = b.m.type_pointer(self.storage, b.m.type_of(self.elem))
        return b._op_id(Op.AccessChain, ptr_t, self.var, idx.id), self.elem, self.storage


class LocalArray(_Array):
    """A small function-local array (registers after unrolling, for register blocking)."""

    storage = "Function"

    def _declare(self, name: str) -> int:
        return self.b._function_variable(self.array_type, name)


class SharedArray(_Array):
    """A workgroup shared array: visible to every invocation of the workgroup; sync with b.barrier()."""

    storage = "Workgroup"

    def _declare(self, name: str) -> int:
        return self.b.m.global_variable("Workgroup", self.array_type, name)

