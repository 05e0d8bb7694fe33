"""`ShaderModule`: a finished kernel variant, with everything the runtime needs to run it."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

from helios.spirv.types import SpirvError

_FORMATS = {"f32": "<f", "u32": "<I", "i32": "<i", "bool": "<I"}


@dataclass(frozen=True)
class BindingInfo:
    """A storage buffer binding in descriptor set 0."""

    binding: int
    access: str  # "r" | "w" | "rw"
    dtype: str = "f32"  # element type of the buffer's scalar view


@dataclass(frozen=True)
class PushField:
    """A 4-byte push-constant field at a byte offset."""

    name: str
    dtype: str  # "f32" | "u32" | "i32"
    offset: int


@dataclass(frozen=True)
class SpecConstant:
    """A specialization constant (SpecId spec_id); bools take 4 bytes (VkBool32)."""

    name: str
    spec_id: int
    dtype: str  # "f32" | "u32" | "i32" | "bool"
    default: int | float


def _pack(dtype: str, value, what: str) -> bytes:
    try:
        if dtype == "f32":
            return struct.pack("<f", float(value))
        if dtype == "bool":
            return struct.pack("<I", 1 if value else 0)
        return struct.pack(_FORMATS[dtype], int(value))
    except (struct.error, TypeError, ValueError) as exc:
        raise SpirvError(f"{what}: cannot pack {value!r} as {dtype} ({exc})") from None


@dataclass(frozen=True)
class ShaderModule:
    """SPIR-V words of one kernel variant (entry point "main", GLCompute) and its interface."""

    name: str
    variant: str
    words: bytes
    bindings: tuple[BindingInfo, ...]
    push_fields: tuple[PushField, ...]
    push_size: int
    spec_constants: tuple[SpecConstant, ...]
    local_size: tuple[int, int, int]
    key: str
    # Each local-size dimension: an int, or the name of the spec constant that sets it.
    local_size_source: tuple[int | str, int | str, int | str] = field(default=(1, 1, 1))
    capabilities: tuple[str, ...] = ()
    extensions: tuple[str, ...] = ()
    # Bindings read and written through device addresses: the runtime pushes each one's address as the
    # fields addr<binding>_lo / addr<binding>_hi (helios.spirv.KernelBuilder.buffer(addressed=True)).
    addressed: tuple[int, ...] = ()
    # Workgroup arrays: (bytes per element, length or the name of the spec constant that sets it).
    shared: tuple[tuple[int, int | str], ...] = ()

    @property
    def label(self) -> str:
        return f"{self.name}:{self.variant}"

    def pack_push(self, values: Mapping[str, int | float]) -> bytes:
        """The push-constant bytes for values (every field, no others)."""
        names = [f.name for f in self.push_fields]
        missing = [n for n in names if n not in values]
        unknown = [n for n in values if n not in names]
        if missing or unknown:
            parts = []
            if missing:
                parts.append(f"missing {', '.join(missing)}")
            if unknown:
                parts.append(f"unknown {', '.join(unknown)}")
            raise SpirvError(
                f"push constants of {self.label}: {'; '.join(parts)} (fields: {', '.join(names) or 'none'})"
            )
        return b"".join(_pack(f.dtype, values[f.name], f"push constant {f.name!r} of {self.label}")
                        for f in self.push_fields)

    def _spec_values(self, values: Mapping[str, int | float] | None) -> dict[str, int | float]:
        values = dict(values or {})
        names = [s.name for s in self.spec_constants]
        unknown = [n for n in values if n not in names]
        if unknown:
            raise SpirvError(
                f"specialization constants of {self.label}: unknown {', '.join(unknown)} "
                f"(constants: {', '.join(names) or 'none'})"
            )
        return {s.name: values.get(s.name, s.default) for s in self.spec_constants}

    def spec_data(self, values: Mapping[str, int | float] | None = None
                  ) -> tuple[bytes, tuple[tuple[int, int, int], ...]]:
        """(data, ((spec_id, offset, size), ...)) for VkSpecializationInfo, defaults filled in."""
        full = self._spec_values(values)
        data, entries = b"", []
        for s in self.spec_constants:
            entries.append((s.spec_id, len(data), 4))
            data += _pack(s.dtype, full[s.name], f"specialization constant {s.name!r} of {self.label}")
        return data, tuple(entries)

    def shared_bytes_for(self, spec: Mapping[str, int | float] | None = None) -> int:
        """Bytes of workgroup memory with the given specialization constants (defaults for the rest)."""
        full = self._spec_values(spec)
        return sum(size * (int(full[n]) if isinstance(n, str) else n) for size, n in self.shared)

    def local_size_for(self, spec: Mapping[str, int | float] | None = None) -> tuple[int, int, int]:
        """The workgroup size with the given specialization constants (defaults for the rest)."""
        full = self._spec_values(spec)
        x, y, z = (int(full[d]) if isinstance(d, str) else d for d in self.local_size_source)
        return x, y, z
