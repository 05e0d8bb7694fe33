"""Cooperative matrices (SPV_KHR_cooperative_matrix): a subgroup holds an M x N tile of a matrix
spread over its lanes, and one instruction multiplies tiles on the GPU's matrix units.

    A = coopmat(f16, 16, 16, "a"); B = coopmat(f16, 16, 16, "b"); C = coopmat(f32, 16, 16, "acc")
    acc = b.var(C, b.coopmat_fill(C, 0.0))
    a = b.coopmat_load(A, x, offset, stride=K, layout="row")     # x: a buffer (or buffer view)
    acc.set(b.coopmat_muladd(a, b.coopmat_load(B, w, ...), acc.load()))
    b.coopmat_store(y, offset, acc.load(), stride=N, layout="row")

Every opcode and enumerant comes from the generated grammar. Which sizes and element types a device
supports is in DeviceInfo.cooperative_matrix. `b.coopmat_lowering("emulated")`, called before the first
cooperative-matrix op, lowers every type and op to plain SPIR-V with the same semantics (coopmat_emulated.py):
that is how lavapipe, which has no matrix units, runs these kernels (DeviceInfo.cooperative_matrix_emulated).

bf16 matrices: natively an OpTypeFloat 16 with the BFloat16KHR encoding (SPV_KHR_bfloat16); they load from
and store to bf16 buffer views or u16 arrays holding bf16 bit patterns (the DSL's bf16 storage type).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from helios.spirv import coopmat_emulated as emulated
from helios.spirv import grammar as g
from helios.spirv.types import ElementKind, ScalarType, SpirvError, u16, u32
from helios.spirv.values import Value

if TYPE_CHECKING:
    from helios.spirv.memory import BufferView
    from helios.spirv.module import Module

EXTENSION = "SPV_KHR_cooperative_matrix"
BF16_EXTENSION = "SPV_KHR_bfloat16"
LOWERINGS = ("native", "emulated")
_USES = {"a": g.CooperativeMatrixUse.MatrixAKHR, "b": g.CooperativeMatrixUse.MatrixBKHR,
         "acc": g.CooperativeMatrixUse.MatrixAccumulatorKHR}
_LAYOUTS = {"row": g.CooperativeMatrixLayout.RowMajorKHR, "col": g.CooperativeMatrixLayout.ColumnMajorKHR}


@dataclass(frozen=True, repr=False)
class CoopMatType(ElementKind):
    """A subgroup-scope cooperative matrix type: element type, rows x cols, and its use in MulAdd
    ("a": the M x K left operand, "b": the K x N right one, "acc": the M x N accumulator)."""

    elem: ScalarType
    rows: int
    cols: int
    use: str

    def __post_init__(self) -> None:
        if self.use not in _USES:
            raise SpirvError(f"cooperative matrix use must be one of {sorted(_USES)}, got {self.use!r}")
        if not (isinstance(self.elem, ScalarType) and (self.elem.is_float or self.elem.is_int)):
            raise SpirvError(f"cooperative matrix elements are float or int scalars, not {self.elem!r}")
        if self.rows < 1 or self.cols < 1:
            raise SpirvError(f"cooperative matrix shape must be positive, got {self.rows}x{self.cols}")

    @property
    def name(self) -> str:
        return f"coopmat<{self.elem.name}, {self.rows}x{self.cols}, {self.use}>"

    @property
    def count(self) -> int:
        return 1


def coopmat(elem: ScalarType, rows: int, cols: int, use: str) -> CoopMatType:
    """The cooperative matrix type of elem, rows x cols, for use "a", "b" or "acc"."""
    return CoopMatType(elem, rows, cols, use)


def _native_elem(m: Module, elem: ScalarType) -> int:
    if elem.name == "bf16":
        m.require_capability("BFloat16TypeKHR")
        m.require_capability("BFloat16CooperativeMatrixKHR")
        m.require_extension(BF16_EXTENSION)
        return m._intern(("float", 16, "bf16"), g.Op.TypeFloat, 16, g.FPEncoding.BFloat16KHR)
    return m.type_of(elem)


def type_id(m: Module, t: CoopMatType) -> int:
    """OpTypeCooperativeMatrixKHR for t (interned; declares the capability and extension), or the slot
    array of an emulated one."""
    if m.coopmat_emulated:
        return emulated.type_id(m, t)
    m.require_capability("CooperativeMatrixKHR")
    m.require_capability("VulkanMemoryModel")  # spirv-val: Shader + CooperativeMatrixKHR need it
    m.require_extension(EXTENSION)
    elem = _native_elem(m, t.elem)
    scope = m.constant(u32, g.Scope.Subgroup)
    rows, cols, use = (m.constant(u32, x) for x in (t.rows, t.cols, _USES[t.use]))
    return m._intern(("coopmat", elem, t.rows, t.cols, t.use), g.Op.TypeCooperativeMatrixKHR,
                     elem, scope, rows, cols, use)


def _layout_id(m: Module, layout: str) -> int:
    if layout not in _LAYOUTS:
        raise SpirvError(f"cooperative matrix layout must be 'row' or 'col', got {layout!r}")
    return m.constant(u32, _LAYOUTS[layout])


def _check_view(view: BufferView, t: CoopMatType, reading: bool) -> None:
    view._check(reading)
    bits = t.elem.name == "bf16" and view.elem == u16  # bf16 bit patterns, e.g. staged in shared memory
    if view.elem != t.elem and not bits:
        raise SpirvError(f"a {t.name} is loaded from and stored to {t.elem.name} elements, "
                         f"not a {view.elem.name} buffer view (use buf.view_as({t.elem.name}))")


class CoopMatOps:
    """The builder's cooperative-matrix instructions (mixed into KernelBuilder)."""

    def coopmat_lowering(self, lowering: str) -> None:
        """"native" (the default: the matrix units' instructions) or "emulated" (plain SPIR-V at subgroup scope,
        any subgroup of 4 lanes or more); before the first cooperative-matrix op."""
        if lowering not in LOWERINGS:
            raise SpirvError(f"cooperative matrix lowering must be one of {LOWERINGS}, got {lowering!r}")
        emulate = lowering == "emulated"
        if emulate != self.m.coopmat_emulated and any(k[0] == "coopmat" for k in self.m._interned):
            raise SpirvError("choose the cooperative matrix lowering before the first cooperative-matrix op")
        self.m.coopmat_emulated = emulate

    def coopmat_fill(self, t: CoopMatType, value) -> Value:
        """A matrix of type t with every element value (a literal or a scalar Value of t.elem; an f32 for bf16)."""
        if self.m.coopmat_emulated:
            return emulated.fill(self, t, value)
        if t.elem.name == "bf16":
            raise SpirvError(f"fill an f32 matrix and coopmat_convert it to {t.name}: bf16 values are f32 in the DSL")
        v = self._as_value(value, t.elem)
        if v.type != t.elem:
            raise SpirvError(f"filling a {t.name} needs a {t.elem.name}, got {v.type.name}")
        return Value(self, self._op_id(g.Op.CompositeConstruct, type_id(self.m, t), v.id), t)

    def coopmat_load(self, t: CoopMatType, view: BufferView, index, stride, layout: str = "row") -> Value:
        """Load a t tile whose first element is view[index]; consecutive rows ("row") or columns ("col")
        are `stride` elements apart. Every element of the tile must be inside the buffer."""
        _check_view(view, t, reading=True)
        _layout_id(self.m, layout)
        if self.m.coopmat_emulated:
            return emulated.load(self, t, view, index, stride, layout)
        operands = self._tile_operands(view, index, stride, layout)
        rid = self._op_id(g.Op.CooperativeMatrixLoadKHR, type_id(self.m, t), *operands)
        return Value(self, rid, t)

    def coopmat_store(self, view: BufferView, index, mat: Value, stride, layout: str = "row") -> None:
        """Store mat with its first element at view[index] (the inverse of coopmat_load)."""
        t = mat.type
        if not isinstance(t, CoopMatType):
            raise SpirvError(f"coopmat_store stores a cooperative matrix, got {t.name}")
        _check_view(view, t, reading=False)
        _layout_id(self.m, layout)
        if self.m.coopmat_emulated:
            return emulated.store(self, view, index, mat, stride, layout)
        ptr, layout_id, stride_id = self._tile_operands(view, index, stride, layout)
        self._emit(g.Op.CooperativeMatrixStoreKHR, ptr, mat.id, layout_id, stride_id)

    def _tile_operands(self, view: BufferView, index, stride, layout: str) -> tuple[int, int, int]:
        """(pointer to view[index], layout id, stride id): the memory operands of a native tile load or store."""
        ptr, _, _ = view._pointer(index)
        stride_v = self._as_index(stride)
        return ptr, _layout_id(self.m, layout), stride_v.id

    def coopmat_muladd(self, a: Value, b: Value, c: Value) -> Value:
        """a x b + c on the matrix units: a is M x K ("a"), b is K x N ("b"), c is M x N ("acc")."""
        ta, tb, tc = a.type, b.type, c.type
        if not all(isinstance(t, CoopMatType) for t in (ta, tb, tc)):
            raise SpirvError("coopmat_muladd multiplies cooperative matrices")
        if (ta.use, tb.use, tc.use) != ("a", "b", "acc"):
            raise SpirvError(f"coopmat_muladd takes uses a, b, acc; got {ta.use}, {tb.use}, {tc.use}")
        if ta.cols != tb.rows or ta.rows != tc.rows or tb.cols != tc.cols:
            raise SpirvError(f"coopmat_muladd shapes do not chain: {ta.rows}x{ta.cols} @ {tb.rows}x{tb.cols} "
                             f"+ {tc.rows}x{tc.cols}")
        if ta.elem != tb.elem or not tc.elem.is_float:
            raise SpirvError(f"coopmat_muladd multiplies matrices of one element type into a float accumulator, "
                             f"got {ta.elem.name} x {tb.elem.name} + {tc.elem.name}")
        if self.m.coopmat_emulated:
            return emulated.muladd(self, a, b, c)
        return Value(self, self._op_id(g.Op.CooperativeMatrixMulAddKHR, type_id(self.m, tc), a.id, b.id, c.id), tc)

    def coopmat_convert(self, mat: Value, t: CoopMatType) -> Value:
        """mat's elements converted to t.elem (same shape; e.g. an f32 accumulator to f16 for storing)."""
        src = mat.type
        if not isinstance(src, CoopMatType) or (src.rows, src.cols) != (t.rows, t.cols):
            raise SpirvError(f"coopmat_convert keeps the shape: {mat.type.name} -> {t.name}")
        if src.elem == t.elem and src.use == t.use:
            return mat
        if self.m.coopmat_emulated:
            return emulated.convert(self, mat, t)
        op = g.Op.FConvert if src.elem.is_float and t.elem.is_float else None
        if op is None:
            raise SpirvError(f"coopmat_convert converts between float element types, not {src.name} -> {t.name}")
        return Value(self, self._op_id(op, type_id(self.m, t), mat.id), t)
