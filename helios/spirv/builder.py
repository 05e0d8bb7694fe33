"""KernelBuilder: the kernel DSL. A build function receives a builder and describes one compute
shader through it; `finish()` returns the ShaderModule.

    def build(b: KernelBuilder, v: Variant) -> None:
        b.local_size(256)
        x, y = b.buffer(0, f32, "r"), b.buffer(1, f32, "w")
        n = b.push("n", u32)
        i = b.global_id(0)
        with b.if_(i < n):
            y[i] = x[i] * 2.0 + 1.0

Declarations: buffer, push, spec, local_size, var, local_array, shared. Builtins: global_id,
local_id, workgroup_id, num_workgroups, local_index, subgroup_size, subgroup_local_id, subgroup_id,
num_subgroups. Control flow (if_/else_, for_range, while_, loop, break/continue, return_) is in
control.py; math, casts, vectors, barriers, subgroup ops and atomics in intrinsics.py. See
docs/SPIRV_DSL.md.
"""

from __future__ import annotations

import hashlib

from helios.spirv import grammar as g
from helios.spirv.control import ControlFlow
from helios.spirv.coopmat import CoopMatOps
from helios.spirv.intrinsics import Intrinsics
from helios.spirv.memory import ACCESS, Buffer, LocalArray, SharedArray, Var
from helios.spirv.module import Module
from helios.spirv.shader import BindingInfo, PushField, ShaderModule, SpecConstant
from helios.spirv.types import DType, ScalarType, SpirvError, VectorType, boolean, f32, i32, u32, vec
from helios.spirv.values import Value, check_literal, literal_type, python_number

_PUSH_TYPES = (f32, u32, i32)


class KernelBuilder(ControlFlow, Intrinsics, CoopMatOps):
    """Builds one compute shader (entry point "main"); see the module docstring."""

    def __init__(self, name: str = "kernel", variant: str = "default") -> None:
        self.name, self.variant = name, variant
        self.m = Module()
        self.m.require_capability("Shader")
        self._fn_vars: list[list[int]] = []  # OpVariable (Function), first in the entry block
        self._prologue: list[list[int]] = []  # builtin and push-constant loads, dominating everything
        self._body: list[list[int]] = []
        self._terminated = False
        self._pending_if = None
        self._loops: list = []
        self._entry_label = self.m.new_id()
        self._function = self.m.new_id()
        self._buffers: dict[int, Buffer] = {}
        self._push: list[tuple[str, ScalarType, int]] = []
        self._specs: list[tuple[str, ScalarType, int | float, int]] = []
        self._spec_by_id: dict[int, str] = {}
        self._shared: list[tuple[int, int | str]] = []
        self._local_size: tuple | None = None
        self._builtins: dict[tuple[str, int], Value] = {}
        self._builtin_vars: dict[str, tuple[int, DType]] = {}
        self._result: ShaderModule | None = None
        self._strided_pointers: set[int] = set()  # PhysicalStorageBuffer pointer types given an ArrayStride

    # -- low-level emission (used by Value, memory and the mixins) -------------------------------
    def _op_id(self, opcode: int, result_type: int, *operands) -> int:
        i = self.m.new_id()
        self._emit(opcode, result_type, i, *operands)
        return i

    def _op(self, opcode: int, dtype: DType, *operands) -> Value:
        """Emit an instruction with a result of dtype; return it as a Value."""
        return Value(self, self._op_id(opcode, self.m.type_of(dtype), *operands), dtype)

    def _as_value(self, x, dtype: DType | None) -> Value:
        """x if it is a Value, else the Python literal x as a constant of dtype (splatted for vectors)."""
        if isinstance(x, Value):
            return x
        if isinstance(x, Var):
            return x.load()
        if dtype is None:
            dtype = literal_type(x)
        c = self.const(x, dtype.elem)
        return self.splat(c, dtype.count)

    def _as_index(self, k) -> Value:
        v = self._as_value(k, u32)
        if v.type not in (u32, i32):
            raise SpirvError(f"an index must be a u32 or i32 scalar, got {v.type.name}")
        return v

    def _function_variable(self, pointee: int, name: str | None = None) -> int:
        ptr = self.m.type_pointer("Function", pointee)
        i = self.m.new_id()
        self.m.emit(self._fn_vars, g.Op.Variable, ptr, i, g.StorageClass.Function)
        if name:
            self.m.name(i, name)
        return i

    # -- constants -------------------------------------------------------------------------------
    def const(self, value, dtype: ScalarType | None = None) -> Value:
        """A constant of dtype (default: f32 for floats, u32 for ints >= 0, i32 below, bool for bools)."""
        value = python_number(value)
        if dtype is None:
            dtype = literal_type(value)
        if isinstance(dtype, VectorType):
            return self.splat(self.const(value, dtype.elem), dtype.count)
        check_literal(value, dtype)
        return Value(self, self.m.constant(dtype, value), dtype)

    def splat(self, x, n: int) -> Value:
        """A vector of n copies of the scalar x (x itself when n == 1 or x is already that vector)."""
        x = self._as_value(x, None)
        if n == 1 or x.type.count == n:
            return x
        if x.type.count != 1:
            raise SpirvError(f"cannot splat a {x.type.name} to {n} components")
        return self._op(g.Op.CompositeConstruct, vec(x.type, n), *([x.id] * n))

    # -- declarations ----------------------------------------------------------------------------
    def local_size(self, x=1, y=1, z=1) -> None:
        """The workgroup size; each dimension an int or a spec constant from b.spec(...)."""
        dims = []
        for d in (x, y, z):
            if isinstance(d, Value):
                if d.id not in self._spec_by_id or d.type != u32:
                    raise SpirvError("local_size takes ints or u32 spec constants from b.spec(...)")
            elif not (isinstance(d, int) and d >= 1):
                raise SpirvError(f"local_size dimensions must be positive ints, got {d!r}")
            dims.append(d)
        self._local_size = tuple(dims)

    def buffer(self, binding: int, dtype: ScalarType, access: str = "rw", addressed: bool = False) -> Buffer:
        """Storage buffer `binding` (set 0) of dtype scalars; access "r", "w" or "rw". An `addressed` buffer
        is still bound (the runtime tracks hazards by binding) but read and written through its device
        address, which the runtime pushes as the fields `addr<binding>_lo` and `addr<binding>_hi`."""
        if access not in ACCESS:
            raise SpirvError(f"buffer access must be one of {ACCESS}, got {access!r}")
        if not isinstance(dtype, ScalarType) or dtype.is_bool:
            raise SpirvError(f"buffers hold f32, f16, i32, u32 or u64, not {dtype!r}")
        if binding in self._buffers:
            raise SpirvError(f"binding {binding} is declared twice")
        address = None
        if addressed:
            address = (self.push(f"addr{binding}_lo", u32), self.push(f"addr{binding}_hi", u32))
        buf = Buffer(self, binding, dtype, access, address)
        self._buffers[binding] = buf
        return buf

    def push(self, name: str, dtype: ScalarType) -> Value:
        """A push-constant field (4 bytes, in declaration order) as a Value."""
        if dtype not in _PUSH_TYPES:
            raise SpirvError(f"push constant {name!r}: type must be f32, u32 or i32, not {dtype!r}")
        if any(n == name for n, _, _ in self._push):
            raise SpirvError(f"push constant {name!r} is declared twice")
        value_id = self.m.new_id()  # loaded in the prologue at finish()
        self._push.append((name, dtype, value_id))
        return Value(self, value_id, dtype)

    def spec(self, name: str, dtype: ScalarType, default) -> Value:
        """A specialization constant (SpecIds in declaration order) usable like any Value."""
        if any(n == name for n, _, _, _ in self._specs):
            raise SpirvError(f"spec constant {name!r} is declared twice")
        if dtype not in (f32, u32, i32, boolean):
            raise SpirvError(f"spec constant {name!r}: type must be f32, u32, i32 or boolean")
        check_literal(default, dtype)
        spec_id = len(self._specs)
        i = self.m.spec_constant(dtype, default, spec_id)
        self.m.name(i, name)
        self._specs.append((name, dtype, default, i))
        self._spec_by_id[i] = name
        return Value(self, i, dtype)

    def var(self, dtype: DType, init=None, name: str | None = None) -> Var:
        """A function-local mutable variable, set to init here (each time control passes here)."""
        v = Var(self, dtype, self._function_variable(self.m.type_of(dtype), name))
        if init is not None:
            v.store(init)
        return v

    def local_array(self, dtype: DType, length, name: str | None = None) -> LocalArray:
        """A function-local array of length (an int or a spec constant) elements."""
        return LocalArray(self, dtype, length, name or "")

    def shared(self, dtype: DType, length, name: str | None = None) -> SharedArray:
        """A workgroup shared array of length (an int or a spec constant) elements."""
        arr = SharedArray(self, dtype, length, name or f"shared{len(self.m.interface)}")
        # What the device contract sums against maxComputeSharedMemorySize: bytes per element, and the length
        # (an int, or the name of the spec constant that sets it at pipeline creation).
        self._shared.append((dtype.size, self._spec_by_id[length.id] if isinstance(length, Value) else int(length)))
        return arr

    # -- builtins --------------------------------------------------------------------------------
    def _builtin(self, builtin: str, dim: int | None) -> Value:
        key = (builtin, -1 if dim is None else dim)
        if key in self._builtins:
            return self._builtins[key]
        if builtin not in self._builtin_vars:
            t = vec(u32, 3) if dim is not None else u32
            var = self.m.global_variable("Input", self.m.type_of(t), builtin)
            self.m.decorate(var, "BuiltIn", self.m.require_enumerant("BuiltIn", builtin))
            self._builtin_vars[builtin] = (var, t)
        var, t = self._builtin_vars[builtin]
        loaded = self.m.new_id()
        self.m.emit(self._prologue, g.Op.Load, self.m.type_of(t), loaded, var)
        if dim is None:
            value = Value(self, loaded, u32)
        else:
            if dim not in (0, 1, 2):
                raise SpirvError(f"dimension must be 0, 1 or 2, got {dim}")
            i = self.m.new_id()
            self.m.emit(self._prologue, g.Op.CompositeExtract, self.m.type_of(u32), i, loaded, dim)
            value = Value(self, i, u32)
        self._builtins[key] = value
        return value

    def global_id(self, dim: int = 0) -> Value:
        return self._builtin("GlobalInvocationId", dim)

    def global_index(self) -> Value:
        """global_id(0) + global_id(1) * (num_workgroups(0) * local size x): a 1-D index over a 2-D grid,
        for arrays needing more than maxComputeWorkGroupCount (65535 on lavapipe) workgroups in x."""
        if self._local_size is None:
            raise SpirvError("call b.local_size(...) before b.global_index()")
        return self.global_id(0) + self.global_id(1) * (self.num_workgroups(0) * self._local_size[0])

    def input(self, binding: int, dtype: ScalarType) -> Buffer:
        """A read-only storage buffer (same as buffer(binding, dtype, "r"))."""
        return self.buffer(binding, dtype, "r")

    def output(self, binding: int, dtype: ScalarType) -> Buffer:
        """A write-only storage buffer (same as buffer(binding, dtype, "w"))."""
        return self.buffer(binding, dtype, "w")

    def local_id(self, dim: int = 0) -> Value:
        return self._builtin("LocalInvocationId", dim)

    def workgroup_id(self, dim: int = 0) -> Value:
        return self._builtin("WorkgroupId", dim)

    def num_workgroups(self, dim: int = 0) -> Value:
        return self._builtin("NumWorkgroups", dim)

    def local_index(self) -> Value:
        """The flattened local invocation index."""
        return self._builtin("LocalInvocationIndex", None)

    def subgroup_size(self) -> Value:
        return self._builtin("SubgroupSize", None)

    def subgroup_local_id(self) -> Value:
        return self._builtin("SubgroupLocalInvocationId", None)

    def subgroup_id(self) -> Value:
        return self._builtin("SubgroupId", None)

    def num_subgroups(self) -> Value:
        return self._builtin("NumSubgroups", None)

    # -- finishing -------------------------------------------------------------------------------
    def _emit_push_block(self) -> None:
        if not self._push:
            return
        m = self.m
        members = tuple(m.type_of(t) for _, t, _ in self._push)
        block = m.type_block(members, tuple(4 * k for k in range(len(members))), tag="push")
        m.name(block, "Push")
        for k, (name, _, _) in enumerate(self._push):
            m.member_name(block, k, name)
        var = m.global_variable("PushConstant", block, "push")
        for k, (_, t, value_id) in enumerate(self._push):
            ptr_t = m.type_pointer("PushConstant", m.type_of(t))
            ptr = m.new_id()
            m.emit(self._prologue, g.Op.AccessChain, ptr_t, ptr, var, m.constant(u32, k))
            m.emit(self._prologue, g.Op.Load, m.type_of(t), value_id, ptr)

    def _emit_local_size(self) -> tuple[tuple[int, int, int], tuple]:
        if self._local_size is None:
            raise SpirvError(f"kernel {self.name!r}: call b.local_size(...) in the build function")
        defaults = {i: d for _, _, d, i in self._specs}
        sizes = tuple(defaults[d.id] if isinstance(d, Value) else d for d in self._local_size)
        sources = tuple(self._spec_by_id[d.id] if isinstance(d, Value) else d for d in self._local_size)
        m = self.m
        m.emit(m.execution_modes, g.Op.ExecutionMode, self._function, g.ExecutionMode.LocalSize, *sizes)
        if any(isinstance(d, Value) for d in self._local_size):
            # The WorkgroupSize builtin overrides LocalSize and may be built from spec constants.
            parts = tuple(d.id if isinstance(d, Value) else m.constant(u32, d) for d in self._local_size)
            wg = m.spec_constant_composite(m.type_of(vec(u32, 3)), parts)
            m.decorate(wg, "BuiltIn", m.require_enumerant("BuiltIn", "WorkgroupSize"))
        return sizes, sources

    def finish(self) -> ShaderModule:
        """Complete the module and return it (idempotent)."""
        if self._result is not None:
            return self._result
        if self._loops:
            raise SpirvError("finish() inside an open loop")
        m = self.m
        self._flush_if()
        self._emit_push_block()
        for buf in self._buffers.values():
            views = buf.used_views()
            if not views:
                _ = buf.var  # keep the binding in the module even if unused
                views = [buf]
            if len(views) > 1 and buf.access != "r":
                for view in views:  # written through one view, read through another
                    m.decorate(view.var, "Aliased")
        sizes, sources = self._emit_local_size()
        void = m.type_void()
        fn_type = m.type_function(void)
        # Cooperative matrices require the Vulkan memory model; everything else keeps GLSL450.
        model = g.MemoryModel.Vulkan if "VulkanMemoryModel" in m.capabilities else g.MemoryModel.GLSL450
        addressing = (g.AddressingModel.PhysicalStorageBuffer64 if "PhysicalStorageBufferAddresses" in m.capabilities
                      else g.AddressingModel.Logical)
        m.emit(m.memory_model, g.Op.MemoryModel, addressing, model)
        m.emit(m.entry_points, g.Op.EntryPoint, g.ExecutionModel.GLCompute, self._function, "main",
               *m.interface)
        m.name(self._function, "main")
        fn = m.functions
        m.emit(fn, g.Op.Function, void, self._function, g.FunctionControl.None_, fn_type)
        m.emit(fn, g.Op.Label, self._entry_label)
        fn.extend(self._fn_vars)
        fn.extend(self._prologue)
        fn.extend(self._body)
        if not self._terminated:
            m.emit(fn, g.Op.Return)
        m.emit(fn, g.Op.FunctionEnd)
        words = m.to_bytes()
        bindings = tuple(BindingInfo(k, self._buffers[k].access, self._buffers[k].dtype.name)
                         for k in sorted(self._buffers))
        push = tuple(PushField(name, t.name, 4 * k) for k, (name, t, _) in enumerate(self._push))
        specs = tuple(SpecConstant(name, k, t.name, d) for k, (name, t, d, _) in enumerate(self._specs))
        self._result = ShaderModule(
            name=self.name, variant=self.variant, words=words, bindings=bindings, push_fields=push,
            push_size=4 * len(push), spec_constants=specs, local_size=sizes,
            key=hashlib.sha256(words).hexdigest(), local_size_source=sources,
            capabilities=tuple(sorted(m.capabilities, key=lambda c: getattr(g.Capability, c))),
            extensions=tuple(sorted(m.extensions)),
            addressed=tuple(k for k in sorted(self._buffers) if self._buffers[k].address is not None),
            shared=tuple(self._shared),
        )
        return self._result
