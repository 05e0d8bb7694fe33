"""KernelBuilder functions beyond operators: math (GLSL.std.450), conversions, select, vectors,
barriers, subgroup operations and atomics."""

from __future__ import annotations

from typing import TYPE_CHECKING

from helios.spirv import grammar as g
from helios.spirv.grammar import GLSLstd450, Op
from helios.spirv.types import DType, ScalarType, SpirvError, VectorType, boolean, f32, i32, u32, vec, with_count
from helios.spirv.values import Value, literal_type

if TYPE_CHECKING:
    from helios.spirv.builder import KernelBuilder

_GROUP_OPS = {"reduce": "Reduce", "inclusive": "InclusiveScan", "exclusive": "ExclusiveScan"}
_SUBGROUP = {
    "add": {"float": Op.GroupNonUniformFAdd, "int": Op.GroupNonUniformIAdd, "uint": Op.GroupNonUniformIAdd},
    "mul": {"float": Op.GroupNonUniformFMul, "int": Op.GroupNonUniformIMul, "uint": Op.GroupNonUniformIMul},
    "max": {"float": Op.GroupNonUniformFMax, "int": Op.GroupNonUniformSMax, "uint": Op.GroupNonUniformUMax},
    "min": {"float": Op.GroupNonUniformFMin, "int": Op.GroupNonUniformSMin, "uint": Op.GroupNonUniformUMin},
}
_MINMAX = {
    "min": {"float": "FMin", "int": "SMin", "uint": "UMin"},
    "max": {"float": "FMax", "int": "SMax", "uint": "UMax"},
    "clamp": {"float": "FClamp", "int": "SClamp", "uint": "UClamp"},
    "abs": {"float": "FAbs", "int": "SAbs"},
    "sign": {"float": "FSign", "int": "SSign"},
}


class Intrinsics:
    """Mixin: built-in functions of the kernel DSL."""

    # -- coercion helpers --------------------------------------------------------------------------
    def _unify(self: KernelBuilder, *xs, what: str) -> list[Value]:
        """Turn a mix of Values and Python literals into Values of one type (literals adopt it)."""
        typed = [x for x in xs if isinstance(x, Value)]
        if typed:
            t = typed[0].type.elem
        elif any(isinstance(x, float) for x in xs):
            t = f32
        elif any(literal_type(x) == i32 for x in xs):
            t = i32
        else:
            t = literal_type(xs[0])
        out = [self._as_value(x, t) for x in xs]
        n = max(v.type.count for v in out)
        out = [self.splat(v, n) for v in out]
        if any(v.type != out[0].type for v in out):
            raise SpirvError(f"{what}: argument types differ ({', '.join(v.type.name for v in out)}); use b.cast")
        return out

    # -- math ------------------------------------------------------------------------------------
    def glsl(self: KernelBuilder, name: str, *args, result: DType | None = None) -> Value:
        """Call GLSL.std.450 instruction `name` (e.g. "Exp") on same-typed arguments."""
        number = getattr(GLSLstd450, name)
        vals = self._unify(*args, what=name)
        caps = g.GLSL_STD_450_CAPABILITIES.get(number)
        if caps:
            self.m.require_capability(caps[0])
        return self._op(Op.ExtInst, result or vals[0].type, self.m.ext_import("GLSL.std.450"), number,
                        *(v.id for v in vals))

    def _float_fn(self: KernelBuilder, name: str, *args) -> Value:
        vals = self._unify(*args, what=name.lower())
        if not vals[0].type.is_float:
            raise SpirvError(f"b.{name.lower()} takes floats, got {vals[0].type.name}; use b.cast first")
        return self.glsl(name, *vals)

    def exp(self, x) -> Value:
        return self._float_fn("Exp", x)

    def exp2(self, x) -> Value:
        return self._float_fn("Exp2", x)

    def log(self, x) -> Value:
        return self._float_fn("Log", x)

    def log2(self, x) -> Value:
        return self._float_fn("Log2", x)

    def sqrt(self, x) -> Value:
        return self._float_fn("Sqrt", x)

    def rsqrt(self, x) -> Value:
        """1 / sqrt(x) (GLSL inversesqrt)."""
        return self._float_fn("InverseSqrt", x)

    inversesqrt = rsqrt

    def tanh(self, x) -> Value:
        return self._float_fn("Tanh", x)

    def sin(self, x) -> Value:
        return self._float_fn("Sin", x)

    def cos(self, x) -> Value:
        return self._float_fn("Cos", x)

    def pow(self, x, y) -> Value:
        return self._float_fn("Pow", x, y)

    def fma(self, a, b, c) -> Value:
        """a * b + c (fused where the device fuses)."""
        return self._float_fn("Fma", a, b, c)

    def exact(self, x: Value) -> Value:
        """x, with the operation that computed it kept apart (NoContraction): a compiler may not fuse it with the
        next one (a multiply and an add into one fma), so x is rounded where it would be if it were stored."""
        self.m.decorate(x.id, "NoContraction")
        return x

    def floor(self, x) -> Value:
        return self._float_fn("Floor", x)

    def ceil(self, x) -> Value:
        return self._float_fn("Ceil", x)

    def _typed_fn(self: KernelBuilder, fn: str, *args) -> Value:
        vals = self._unify(*args, what=fn)
        name = _MINMAX[fn].get(vals[0].type.kind)
        if name is None:
            raise SpirvError(f"b.{fn} is not defined on {vals[0].type.name}")
        return self.glsl(name, *vals)

    def min(self, a, c) -> Value:
        return self._typed_fn("min", a, c)

    def max(self, a, c) -> Value:
        return self._typed_fn("max", a, c)

    def clamp(self, x, lo, hi) -> Value:
        return self._typed_fn("clamp", x, lo, hi)

    def abs(self, x) -> Value:
        return self._typed_fn("abs", x)

    fabs = abs
    fmin = min
    fmax = max
    fclamp = clamp

    def sign(self, x) -> Value:
        return self._typed_fn("sign", x)

    # -- conversions and selection ---------------------------------------------------------------
    def select(self: KernelBuilder, cond, a, c) -> Value:
        """cond ? a : c (per component for vector conditions)."""
        cond = self._as_value(cond, boolean)
        if cond.type.elem != boolean:
            raise SpirvError(f"select needs a boolean condition, got {cond.type.name}")
        a, c = self._unify(a, c, what="select")
        return self._op(Op.Select, a.type, cond.id, a.id, c.id)

    def cast(self: KernelBuilder, x, dtype: ScalarType) -> Value:
        """Convert numerically to dtype (per component for vectors); bool -> 1/0, number -> bool is != 0."""
        if not isinstance(x, Value):
            return self.const(x, dtype)
        if isinstance(dtype, VectorType):
            dtype = dtype.elem
        src, n = x.type.elem, x.type.count
        dst = with_count(dtype, n)
        if src == dtype:
            return x
        if dtype.is_bool:
            return x.ne(0.0 if src.is_float else 0)
        if src.is_bool:
            one, zero = (1.0, 0.0) if dtype.is_float else (1, 0)
            return self.select(x, self.splat(self.const(one, dtype), n), self.splat(self.const(zero, dtype), n))
        if src.is_float and dtype.is_float:
            op = Op.FConvert
        elif src.is_float:
            op = Op.ConvertFToS if dtype.kind == "int" else Op.ConvertFToU
        elif dtype.is_float:
            op = Op.ConvertSToF if src.kind == "int" else Op.ConvertUToF
        elif src.width == dtype.width:
            op = Op.Bitcast  # i32 <-> u32: same bits
        elif src.width > dtype.width:  # truncation; OpUConvert's result must be unsigned
            op = Op.SConvert if dtype.kind == "int" else Op.UConvert
        else:  # extension by the source's signedness (the only wider type, u64, is unsigned)
            op = Op.SConvert if src.kind == "int" else Op.UConvert
        return self._op(op, dst, x.id)

    def bitcast(self: KernelBuilder, x: Value, dtype: DType) -> Value:
        """Reinterpret the bits of x as dtype. A vector dtype is taken as is: any type of the same total
        width whose component counts divide one another (vec(f32, 4) <-> vec(u64, 2), vec(u32, 2) <-> u64).
        A scalar dtype keeps x's component count (bitcast(vec4<f32>, u32) is a vec4<u32>) unless only
        the scalar itself matches x's width (bitcast(vec2<u32>, u64) is a u64)."""
        if isinstance(dtype, VectorType):
            dst = dtype
        else:
            dst = with_count(dtype, x.type.count)
            if dst.size != x.type.size and dtype.size == x.type.size:
                dst = dtype
        counts = sorted((dst.count, x.type.count))
        if dst.size != x.type.size or counts[1] % counts[0] or dst.is_bool or x.type.is_bool:
            raise SpirvError(f"cannot bitcast {x.type.name} to {dst.name}: the total widths differ, one "
                             f"component count is not a multiple of the other, or a type is bool")
        return x if dst == x.type else self._op(Op.Bitcast, dst, x.id)

    # -- vectors ---------------------------------------------------------------------------------
    def vector(self: KernelBuilder, *parts) -> Value:
        """A vector from scalars (all one type; literals adopt it)."""
        vals = self._unify(*parts, what="vector")
        t = vals[0].type
        if not isinstance(t, ScalarType):
            raise SpirvError("b.vector takes scalars")
        return self._op(Op.CompositeConstruct, vec(t, len(vals)), *(v.id for v in vals))

    def vec4(self, x, y, z, w) -> Value:
        return self.vector(x, y, z, w)

    def vec2(self, x, y) -> Value:
        return self.vector(x, y)

    def dot(self: KernelBuilder, a, c) -> Value:
        a, c = self._unify(a, c, what="dot")
        if not (isinstance(a.type, VectorType) and a.type.is_float):
            raise SpirvError(f"dot takes float vectors, got {a.type.name}")
        return self._op(Op.Dot, a.type.elem, a.id, c.id)

    # -- synchronisation -------------------------------------------------------------------------
    def barrier(self: KernelBuilder, buffers: bool = False) -> None:
        """Workgroup execution barrier that also orders shared memory (and storage buffers if buffers)."""
        sem = g.MemorySemantics.AcquireRelease | g.MemorySemantics.WorkgroupMemory
        if buffers:
            sem |= g.MemorySemantics.UniformMemory
        if "VulkanMemoryModel" in self.m.capabilities:  # there, availability and visibility are explicit
            sem |= g.MemorySemantics.MakeAvailable | g.MemorySemantics.MakeVisible
        wg = self.m.constant(u32, g.Scope.Workgroup)
        self._emit(Op.ControlBarrier, wg, wg, self.m.constant(u32, sem))

    def subgroup_barrier(self: KernelBuilder) -> None:
        """Subgroup execution barrier that also orders storage buffers: every lane's earlier buffer accesses
        happen before any lane's later ones (e.g. one lane's atomic that publishes the subgroup's writes)."""
        sem = g.MemorySemantics.AcquireRelease | g.MemorySemantics.UniformMemory
        if "VulkanMemoryModel" in self.m.capabilities:
            sem |= g.MemorySemantics.MakeAvailable | g.MemorySemantics.MakeVisible
        sg = self.m.constant(u32, g.Scope.Subgroup)
        self._emit(Op.ControlBarrier, sg, sg, self.m.constant(u32, sem))

    def device_memory_barrier(self: KernelBuilder) -> None:
        """Orders this invocation's storage-buffer accesses at device scope (no execution barrier): before an atomic
        that tells other workgroups its writes are done (release), and after the atomic that says theirs are
        (acquire)."""
        sem = g.MemorySemantics.AcquireRelease | g.MemorySemantics.UniformMemory
        if "VulkanMemoryModel" in self.m.capabilities:
            sem |= g.MemorySemantics.MakeAvailable | g.MemorySemantics.MakeVisible
        self._emit(Op.MemoryBarrier, self.m.constant(u32, g.Scope.Device), self.m.constant(u32, sem))

    # -- subgroups -------------------------------------------------------------------------------
    def _subgroup_scope(self: KernelBuilder) -> int:
        return self.m.constant(u32, g.Scope.Subgroup)

    def _subgroup_arith(self: KernelBuilder, fn: str, x, op: str) -> Value:
        if op not in _GROUP_OPS:
            raise SpirvError(f"subgroup op must be one of {sorted(_GROUP_OPS)}, got {op!r}")
        x = self._as_value(x, None)
        opcode = _SUBGROUP[fn].get(x.type.kind)
        if opcode is None:
            raise SpirvError(f"subgroup_{fn} is not defined on {x.type.name}")
        self.m.require_capability("GroupNonUniformArithmetic")
        group_op = getattr(g.GroupOperation, _GROUP_OPS[op])
        return self._op(opcode, x.type, self._subgroup_scope(), group_op, x.id)

    def subgroup_add(self, x, op: str = "reduce") -> Value:
        """Sum over the subgroup's active invocations (op="inclusive"/"exclusive" for prefix sums)."""
        return self._subgroup_arith("add", x, op)

    def subgroup_mul(self, x, op: str = "reduce") -> Value:
        return self._subgroup_arith("mul", x, op)

    def subgroup_max(self, x, op: str = "reduce") -> Value:
        return self._subgroup_arith("max", x, op)

    def subgroup_min(self, x, op: str = "reduce") -> Value:
        return self._subgroup_arith("min", x, op)

    def subgroup_shuffle_xor(self: KernelBuilder, x, mask) -> Value:
        """x from the invocation whose subgroup-local id is ours XOR mask."""
        x = self._as_value(x, None)
        mask = self._as_value(mask, u32)
        self.m.require_capability("GroupNonUniformShuffle")
        return self._op(Op.GroupNonUniformShuffleXor, x.type, self._subgroup_scope(), x.id, mask.id)

    def _lane(self: KernelBuilder, lane, what: str) -> Value:
        """A subgroup invocation id as a u32 Value (ints become constants; i32 Values are reinterpreted)."""
        lane = self._as_value(lane, u32)
        if lane.type not in (u32, i32):
            raise SpirvError(f"{what}: the lane must be a u32 or i32 scalar, got {lane.type.name}")
        return self.bitcast(lane, u32)

    def subgroup_broadcast(self: KernelBuilder, x, lane) -> Value:
        """x from subgroup invocation `lane` (an int, or a Value that is the same in every active
        invocation: a constant, spec or push constant, or a uniform loop counter). The lane must be
        active. For a lane that differs between invocations use subgroup_shuffle."""
        x = self._as_value(x, None)
        lane = self._lane(lane, "subgroup_broadcast")
        self.m.require_capability("GroupNonUniformBallot")
        return self._op(Op.GroupNonUniformBroadcast, x.type, self._subgroup_scope(), x.id, lane.id)

    def subgroup_shuffle(self: KernelBuilder, x, lane) -> Value:
        """x from subgroup invocation `lane`, which may differ per invocation (it must be active)."""
        x = self._as_value(x, None)
        lane = self._lane(lane, "subgroup_shuffle")
        self.m.require_capability("GroupNonUniformShuffle")
        return self._op(Op.GroupNonUniformShuffle, x.type, self._subgroup_scope(), x.id, lane.id)

    def subgroup_broadcast_first(self: KernelBuilder, x) -> Value:
        """x from the lowest-numbered active invocation of the subgroup."""
        x = self._as_value(x, None)
        self.m.require_capability("GroupNonUniformBallot")
        return self._op(Op.GroupNonUniformBroadcastFirst, x.type, self._subgroup_scope(), x.id)

    def subgroup_elect(self: KernelBuilder) -> Value:
        """True in exactly one active invocation of the subgroup."""
        self.m.require_capability("GroupNonUniform")
        return self._op(Op.GroupNonUniformElect, boolean, self._subgroup_scope())

    # -- atomics ---------------------------------------------------------------------------------
    def atomic_add(self: KernelBuilder, target, index, value) -> Value:
        """Atomically add value to target[index] (a buffer, buffer view or shared array); returns the
        old value. Float adds need the device's float atomics (Kernel requires=...)."""
        ptr, t, storage = target._pointer(index)
        v = self._as_value(value, t)
        if v.type != t or not isinstance(t, ScalarType):
            raise SpirvError(f"atomic_add of a {v.type.name} into a {t.name} element")
        scope = self.m.constant(u32, g.Scope.Workgroup if storage == "Workgroup" else g.Scope.Device)
        relaxed = self.m.constant(u32, g.MemorySemantics.Relaxed)
        if t.is_float:
            if t.width != 32:
                raise SpirvError("float atomic add is supported on f32 only")
            self.m.require_capability("AtomicFloat32AddEXT")
            return self._op(Op.AtomicFAddEXT, t, ptr, scope, relaxed, v.id)
        if not t.is_int:
            raise SpirvError(f"atomic_add is not defined on {t.name}")
        return self._op(Op.AtomicIAdd, t, ptr, scope, relaxed, v.id)
