"""A SPIR-V module under construction: ids, logical-layout sections, interned types and constants.

Everything that ends up in the binary passes through `Module`: ids are allocated by `new_id`, each
instruction goes into the section the spec's logical layout puts it in, types and constants are interned
by a structural key (so asking twice gives the same id), and the capabilities and extensions an
instruction or enumerant needs are collected as it is used. Output is byte-deterministic: the same
sequence of calls gives the same words.
"""

from __future__ import annotations

import struct

from helios.spirv import grammar as g
from helios.spirv.types import DType, ScalarType, SpirvError, VectorType

SPIRV_VERSION = (1, 5)  # the newest version Vulkan 1.2 accepts
_GENERATOR = 0  # "unregistered" generator id
# Capabilities of OpenCL kernels, never valid in a Vulkan shader: not chosen when there is an alternative.
_NOT_FOR_SHADERS = frozenset({"Kernel", "Addresses", "Linkage", "Vector16", "Int64Atomics"})


def _version(text: str) -> tuple[int, int]:
    if text == "None":
        return (99, 99)  # extension only
    major, minor = text.split(".")
    return int(major), int(minor)


def encode_string(text: str) -> list[int]:
    """A literal string: UTF-8, nul-terminated, padded to whole little-endian words."""
    data = text.encode() + b"\0"
    data += b"\0" * (-len(data) % 4)
    return list(struct.unpack(f"<{len(data) // 4}I", data))


def instruction(opcode: int, operands) -> list[int]:
    """Encode one instruction; operands are ints (one word each), strings or lists of words."""
    for op in operands:  # the common case, ids and literal words only, is one list (a plain loop: fastest)
        if type(op) is not int or not 0 <= op <= 0xFFFFFFFF:
            break
    else:
        return [((len(operands) + 1) << 16) | opcode, *operands]
    words: list[int] = [0]
    for op in operands:
        if isinstance(op, str):
            words.extend(encode_string(op))
        elif isinstance(op, list | tuple):
            words.extend(op)
        else:
            words.append(int(op) & 0xFFFFFFFF)
    words[0] = (len(words) << 16) | opcode
    return words


def scalar_words(dtype: ScalarType, value) -> list[int]:
    """The literal words of a scalar constant of dtype."""
    if dtype.kind == "float":
        if dtype.width == 32:
            return [struct.unpack("<I", struct.pack("<f", float(value)))[0]]
        if dtype.width == 16:
            return [struct.unpack("<H", struct.pack("<e", float(value)))[0]]
    elif dtype.kind in ("int", "uint") and dtype.width in (32, 64):
        v, w = int(value), dtype.width
        lo, hi = (-(1 << (w - 1)), (1 << (w - 1)) - 1) if dtype.kind == "int" else (0, (1 << w) - 1)
        if not lo <= v <= hi:
            raise SpirvError(f"constant {value!r} does not fit in {dtype.name}")
        v &= (1 << w) - 1
        return [v & 0xFFFFFFFF] if w == 32 else [v & 0xFFFFFFFF, v >> 32]  # low-order word first
    raise SpirvError(f"no literal encoding for {dtype!r}")


class Module:
    """Sections of a SPIR-V module in logical-layout order, with interning and capability tracking."""

    def __init__(self, version: tuple[int, int] = SPIRV_VERSION) -> None:
        self.version = version
        self._bound = 1
        self.capabilities: dict[str, None] = {}
        self.extensions: dict[str, None] = {}
        self.ext_imports: list[list[int]] = []
        self._ext_import_ids: dict[str, int] = {}
        self.memory_model: list[list[int]] = []
        self.entry_points: list[list[int]] = []
        self.execution_modes: list[list[int]] = []
        self.debug_names: list[list[int]] = []
        self.annotations: list[list[int]] = []
        self.globals: list[list[int]] = []  # types, constants, global variables, in definition order
        self.functions: list[list[int]] = []
        self.interface: list[int] = []  # every non-Function global variable, for OpEntryPoint
        self._interned: dict[tuple, int] = {}
        self._type_ids: dict[DType, int] = {}  # type_of's answers (every DSL type is a frozen dataclass)
        self._instructions_required: set[int] = set()  # opcodes whose capabilities are declared
        self._decorated: set[tuple] = set()
        # KernelBuilder.coopmat_lowering("emulated"): cooperative matrices become plain arrays (coopmat_emulated)
        self.coopmat_emulated = False
        self.coopmat_arrays: dict[int, object] = {}  # value id -> the local array an emulated op built it in

    # -- ids and emission ------------------------------------------------------------------------
    def new_id(self) -> int:
        i = self._bound
        self._bound += 1
        return i

    def emit(self, section: list[list[int]], opcode: int, *operands) -> list[int]:
        """Append an instruction to a section, collecting what it needs; returns its (mutable) words."""
        self.require_instruction(opcode)
        words = instruction(opcode, operands)
        section.append(words)
        return words

    # -- capabilities and extensions -------------------------------------------------------------
    def require_capability(self, name: str) -> None:
        if name in self.capabilities:
            return
        getattr(g.Capability, name)  # AttributeError on a typo
        self.capabilities[name] = None
        self._require_extension_for(g.ENUMERANT_VERSIONS.get(("Capability", name)),
                                    g.ENUMERANT_EXTENSIONS.get(("Capability", name)))

    def require_extension(self, name: str) -> None:
        self.extensions.setdefault(name, None)

    def _require_extension_for(self, version: str | None, extensions) -> None:
        if version is not None and extensions and _version(version) > self.version:
            self.require_extension(extensions[0])

    def _require_any(self, caps) -> None:
        """Declare one of caps unless one is already declared (the first a shader may use)."""
        if caps and not any(c in self.capabilities for c in caps):
            usable = [c for c in caps if c not in _NOT_FOR_SHADERS]
            self.require_capability((usable or caps)[0])

    def require_instruction(self, opcode: int) -> None:
        if opcode in self._instructions_required:  # what it needs is declared, and declarations only grow
            return
        self._require_any(g.INSTRUCTION_CAPABILITIES.get(opcode))
        self._require_extension_for(g.INSTRUCTION_VERSIONS.get(opcode), g.INSTRUCTION_EXTENSIONS.get(opcode))
        self._instructions_required.add(opcode)

    def require_enumerant(self, kind: str, name: str) -> int:
        """The value of an enumerant, declaring the capability and extension it needs."""
        value = getattr(getattr(g, kind), name)
        self._require_any(g.ENUMERANT_CAPABILITIES.get((kind, name)))
        self._require_extension_for(g.ENUMERANT_VERSIONS.get((kind, name)),
                                    g.ENUMERANT_EXTENSIONS.get((kind, name)))
        return value

    def ext_import(self, name: str) -> int:
        if name not in self._ext_import_ids:
            i = self.new_id()
            self._ext_import_ids[name] = i
            self.ext_imports.append(instruction(g.Op.ExtInstImport, [i, name]))
        return self._ext_import_ids[name]

    # -- debug names and decorations -------------------------------------------------------------
    def name(self, target: int, text: str) -> None:
        self.debug_names.append(instruction(g.Op.Name, [target, text]))

    def member_name(self, struct_id: int, member: int, text: str) -> None:
        self.debug_names.append(instruction(g.Op.MemberName, [struct_id, member, text]))

    def decorate(self, target: int, decoration: str, *args) -> None:
        key = ("d", target, decoration, args)
        if key in self._decorated:
            return
        self._decorated.add(key)
        value = self.require_enumerant("Decoration", decoration)
        self.emit(self.annotations, g.Op.Decorate, target, value, *args)

    def member_decorate(self, struct_id: int, member: int, decoration: str, *args) -> None:
        key = ("m", struct_id, member, decoration, args)
        if key in self._decorated:
            return
        self._decorated.add(key)
        value = self.require_enumerant("Decoration", decoration)
        self.emit(self.annotations, g.Op.MemberDecorate, struct_id, member, value, *args)

    # -- types -----------------------------------------------------------------------------------
    def _intern(self, key: tuple, opcode: int, *operands) -> int:
        """The id of the global defined by (opcode, operands), emitting it the first time."""
        if key not in self._interned:
            i = self.new_id()
            self.emit(self.globals, opcode, i, *operands)
            self._interned[key] = i
        return self._interned[key]

    def _intern_typed(self, key: tuple, opcode: int, result_type: int, *operands) -> int:
        """Like _intern for instructions that have a result type (constants)."""
        if key not in self._interned:
            i = self.new_id()
            self.emit(self.globals, opcode, result_type, i, *operands)
            self._interned[key] = i
        return self._interned[key]

    def type_void(self) -> int:
        return self._intern(("void",), g.Op.TypeVoid)

    def type_bool(self) -> int:
        return self._intern(("bool",), g.Op.TypeBool)

    def type_int(self, width: int, signed: bool) -> int:
        if width in (16, 64):
            self.require_capability(f"Int{width}")
        return self._intern(("int", width, signed), g.Op.TypeInt, width, int(signed))

    def type_float(self, width: int) -> int:
        if width == 16:
            self.require_capability("Float16")
        return self._intern(("float", width), g.Op.TypeFloat, width)

    def type_vector(self, elem: int, n: int) -> int:
        return self._intern(("vector", elem, n), g.Op.TypeVector, elem, n)

    def type_of(self, dtype: DType) -> int:
        """The type id of a DSL data type."""
        known = self._type_ids.get(dtype)
        if known is None:
            known = self._type_ids[dtype] = self._declare_type(dtype)
        return known

    def _declare_type(self, dtype: DType) -> int:
        from helios.spirv import coopmat  # cooperative matrices are rare: kept out of the common path

        if isinstance(dtype, coopmat.CoopMatType):
            return coopmat.type_id(self, dtype)
        if dtype.elem.name in ("bf16", "fp16"):
            raise SpirvError(f"{dtype.elem.name} is a storage type: its buffer elements load as f32 and store "
                             "from f32; compute in f32")
        if isinstance(dtype, VectorType):
            return self.type_vector(self.type_of(dtype.elem), dtype.count)
        if dtype.kind == "float":
            return self.type_float(dtype.width)
        if dtype.kind == "bool":
            return self.type_bool()
        return self.type_int(dtype.width, dtype.kind == "int")

    def type_array(self, elem: int, length_id: int, stride: int | None = None) -> int:
        """An array type; length_id is a constant or specialization constant id."""
        i = self._intern(("array", elem, length_id, stride), g.Op.TypeArray, elem, length_id)
        if stride is not None:
            self.decorate(i, "ArrayStride", stride)
        return i

    def type_runtime_array(self, elem: int, stride: int) -> int:
        i = self._intern(("rtarray", elem, stride), g.Op.TypeRuntimeArray, elem)
        self.decorate(i, "ArrayStride", stride)
        return i

    def type_block(self, members: tuple[int, ...], offsets: tuple[int, ...], tag: str = "") -> int:
        """A Block-decorated struct with explicit member offsets (buffer and push-constant blocks)."""
        i = self._intern(("block", members, offsets, tag), g.Op.TypeStruct, *members)
        self.decorate(i, "Block")
        for k, off in enumerate(offsets):
            self.member_decorate(i, k, "Offset", off)
        return i

    def type_pointer(self, storage: str, pointee: int) -> int:
        sc = self.require_enumerant("StorageClass", storage)
        return self._intern(("pointer", sc, pointee), g.Op.TypePointer, sc, pointee)

    def type_function(self, result: int, *params: int) -> int:
        return self._intern(("function", result, params), g.Op.TypeFunction, result, *params)

    # -- constants -------------------------------------------------------------------------------
    def constant(self, dtype: ScalarType, value) -> int:
        """An interned scalar constant."""
        t = self.type_of(dtype)
        if dtype.kind == "bool":
            op = g.Op.ConstantTrue if value else g.Op.ConstantFalse
            return self._intern_typed(("const", t, bool(value)), op, t)
        words = scalar_words(dtype, value)
        return self._intern_typed(("const", t, tuple(words)), g.Op.Constant, t, words)

    def constant_composite(self, type_id: int, parts: tuple[int, ...]) -> int:
        return self._intern_typed(("composite", type_id, parts), g.Op.ConstantComposite, type_id, *parts)

    def spec_constant(self, dtype: ScalarType, default, spec_id: int) -> int:
        """A new specialization constant decorated with SpecId (never interned)."""
        t = self.type_of(dtype)
        i = self.new_id()
        if dtype.kind == "bool":
            self.emit(self.globals, g.Op.SpecConstantTrue if default else g.Op.SpecConstantFalse, t, i)
        else:
            self.emit(self.globals, g.Op.SpecConstant, t, i, scalar_words(dtype, default))
        self.decorate(i, "SpecId", spec_id)
        return i

    def spec_constant_composite(self, type_id: int, parts: tuple[int, ...]) -> int:
        i = self.new_id()
        self.emit(self.globals, g.Op.SpecConstantComposite, type_id, i, *parts)
        return i

    # -- variables -------------------------------------------------------------------------------
    def global_variable(self, storage: str, pointee: int, name: str | None = None) -> int:
        """A module-scope variable; it is added to the entry point's interface."""
        ptr = self.type_pointer(storage, pointee)
        i = self.new_id()
        self.emit(self.globals, g.Op.Variable, ptr, i, getattr(g.StorageClass, storage))
        self.interface.append(i)
        if name:
            self.name(i, name)
        return i

    # -- output ----------------------------------------------------------------------------------
    def words(self) -> list[int]:
        """The module's words: header, then each section in logical-layout order."""
        out = [g.MAGIC_NUMBER, (self.version[0] << 16) | (self.version[1] << 8), _GENERATOR, self._bound, 0]
        caps = sorted(self.capabilities, key=lambda c: getattr(g.Capability, c))
        for c in caps:
            out += instruction(g.Op.Capability, [getattr(g.Capability, c)])
        for e in sorted(self.extensions):
            out += instruction(g.Op.Extension, [e])
        for section in (self.ext_imports, self.memory_model, self.entry_points, self.execution_modes,
                        self.debug_names, self.annotations, self.globals, self.functions):
            for ins in section:
                out += ins
        return out

    def to_bytes(self) -> bytes:
        w = self.words()
        return struct.pack(f"<{len(w)}I", *w)
