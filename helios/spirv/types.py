"""Data types of kernel values: scalars (f32, f16, i32, u32, u64, boolean) and vectors (vec(f32, 4))."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from helios.errors import HeliosError


class SpirvError(HeliosError):
    """A kernel was written in a way that cannot become valid SPIR-V (type mismatch, misuse of the DSL)."""


@dataclass(frozen=True)
class ScalarType:
    """A scalar type: kind is "float", "int" (signed), "uint" or "bool"; width in bits."""

    name: str
    kind: str
    width: int

    @property
    def elem(self) -> ScalarType:
        return self

    @property
    def count(self) -> int:
        return 1

    @property
    def size(self) -> int:
        """Size in bytes in a buffer (bool has none; it is 4 as a specialization constant)."""
        return self.width // 8

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    def __repr__(self) -> str:
        return self.name


class ElementKind:
    """kind / is_float / is_int / is_bool of a composite type, taken from its element type `elem`."""

    elem: ScalarType

    @property
    def kind(self) -> str:
        return self.elem.kind

    @property
    def is_float(self) -> bool:
        return self.elem.is_float

    @property
    def is_int(self) -> bool:
        return self.elem.is_int

    @property
    def is_bool(self) -> bool:
        return self.elem.is_bool

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True, repr=False)
class VectorType(ElementKind):
    """A vector of 2 to 4 scalars."""

    elem: ScalarType
    count: int

    @property
    def name(self) -> str:
        return f"vec{self.count}<{self.elem.name}>"

    @property
    def size(self) -> int:
        return self.elem.size * self.count


DType = ScalarType | VectorType

f32 = ScalarType("f32", "float", 32)
f16 = ScalarType("f16", "float", 16)
i32 = ScalarType("i32", "int", 32)
u32 = ScalarType("u32", "uint", 32)
u64 = ScalarType("u64", "uint", 64)  # needs the Int64 capability (shaderInt64), declared when the type is used
u16 = ScalarType("u16", "uint", 16)  # needs Int16 (shaderInt16); in buffers also StorageBuffer16BitAccess
# bfloat16 is a storage type: a bf16 buffer holds 16-bit patterns (the top half of an f32), its elements load
# as f32 and f32 values store rounded to nearest even. It runs on any device with 16-bit storage and Int16.
bf16 = ScalarType("bf16", "float", 16)
# fp16 is the IEEE half as a storage type, the same way: 16-bit patterns that load as f32 (exactly, through
# GLSL UnpackHalf2x16) and store from f32 rounded to nearest even (PackHalf2x16), so it needs no Float16
# arithmetic. f16 is the native arithmetic type (shaderFloat16), which the matrix-unit kernels use.
fp16 = ScalarType("fp16", "float", 16)
boolean = ScalarType("bool", "bool", 32)


@cache
def vec(elem: ScalarType, n: int) -> VectorType:
    """The vector type of n (2..4) elements of a scalar type: vec(f32, 4)."""
    if not isinstance(elem, ScalarType):
        raise SpirvError(f"vec() takes a scalar type, got {elem!r}")
    if n not in (2, 3, 4):
        raise SpirvError(f"vectors have 2, 3 or 4 components, not {n}")
    return VectorType(elem, n)


def with_count(t: DType, n: int) -> DType:
    """t's element type with n components (a scalar when n == 1)."""
    return t.elem if n == 1 else vec(t.elem, n)
