"""Pieces shared by the flash-attention kernels: declarations, the row/lane geometry, streamed operands.

Every attention kernel is row-parallel: a group of TPR invocations ("lanes") owns RQ consecutive rows (query
rows for the forward and dQ kernels, key rows for the dK/dV kernel) and lane l holds the vec4 components
l, l + TPR, l + 2*TPR, ... of the head dimension of each in registers (NV = ceil(D4 / TPR) per row). The
other operand is streamed KB rows at a time (class Stream): read from the fused QKV tensor by the
subgroup and shared through broadcasts (variant "rowwise", TPR = 1: no shared memory, no barriers, the fast
kind on lavapipe) or from BC-row tiles staged in shared memory by the whole workgroup (variant "tiled",
TPR = 4: the fast kind on GPUs). Dot products over the head dimension are summed over the TPR lanes of a
row with subgroup shuffles.

Every variant exists for each float dtype (dtypes.with_dtypes: "rowwise", "bf16_rowwise", "fp16_rowwise", ...):
a half variant reads qkv, o and dO as 16-bit values widened to f32 and stores o and dqkv rounded once; lse,
Delta, scores, softmax statistics and every accumulator stay f32, so the math is the f32 variant's.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from helios.kernels.contract.dtypes import storage, variant_dtype, with_dtypes
from helios.kernels.lib.wide import WideView
from helios.spirv import KernelBuilder, Value, Variant, boolean, ceil_div, f32, u32, u64, vec

vec4 = vec(f32, 4)
NEG = -1.0e30  # "minus infinity" for running maxima: finite, so exp(NEG - NEG) never makes a NaN
MAX_D4 = 64  # head_dim <= 256
UNROLLED_MAX_D = 64  # "rowwise_unrolled" runs head dims up to here (its JIT time grows with them)
TILED_MAX_D = 128  # the tiled variant's K/V tiles (bc rows x head_dim) fit 32 KiB of shared memory up to here

VARIANTS = {
    # lavapipe: every buffer or shared load costs a per-lane loop there, so what counts is loads per
    # (row, key) pair: each invocation owns RQ query rows, each K/V row is loaded once per subgroup and
    # shared by broadcasts ("bcast"), as 64-bit words ("wide"; needs shaderInt64: the rule reads
    # DeviceInfo.int64 and takes "rowwise_vec4" without it). Registers only, no shared memory or barriers;
    # head-dim loops stay loops.
    # Key blocks of 8 (forward and backward) re-tuned on lavapipe 25: fwd+bwd 1.28x blocks of 4 (Mesa 22's
    # choice), at ~20% more JIT time on a cold shader cache.
    "rowwise": {"tiled": False, "tpr": 1, "rq": 8, "wg": 8, "kb": 8, "kb_bwd": 8, "bc": 0, "unroll": False,
                "bcast": True, "wide": True},
    # "rowwise" for devices without shaderInt64 (SwiftShader, many mobile GPUs): the same kernel with K/V rows
    # loaded as vec4<f32> (or 16-bit storage) instead of 64-bit words.
    "rowwise_vec4": {"tiled": False, "tpr": 1, "rq": 8, "wg": 8, "kb": 8, "kb_bwd": 8, "bc": 0, "unroll": False,
                     "bcast": True, "wide": False},
    # lavapipe: "rowwise" with the head-dim loops unrolled and 4 rows per lane. Rolled, every register array
    # (q, k, v, the accumulators, the broadcast slots) is indexed by the loop counter, which llvmpipe cannot keep
    # in registers; unrolled, the indices are constants and the arrays become SSA values (spilled to the stack
    # where they outgrow the register file, cheap next to indexed accesses). 4 rows rather than 8 halves the
    # code and the JIT time and measured no slower (B2 H4 T128 D48 fwd+bwd: rowwise 5.3 ms, this at 8 rows
    # 3.1 ms, at 4 rows 2.6 ms, at 2 rows 3.0 ms). Its JIT time grows with the head dim (cold, optimised, all
    # four kernels at D48: ~20 s single-threaded, against rowwise's ~5 s), so the rule runs it up to
    # UNROLLED_MAX_D and in f32 only; rowwise elsewhere.
    # It reads and writes every buffer through device addresses ("addressed": the rule runs it only where the
    # device enables them, DeviceInfo.buffer_device_address): llvmpipe turns a lane's own load into a gather
    # instead of a bounds-checked loop over the lanes (GALLIVM_DEBUG=asm: ~1,000 instructions of such loops per
    # key block of the forward at head dim 32). fwd+bwd B2 H4 T128 D32 1.13 -> 1.07-1.10 ms; the same values.
    "rowwise_unrolled": {"tiled": False, "tpr": 1, "rq": 4, "wg": 8, "kb": 8, "kb_bwd": 8, "bc": 0, "unroll": True,
                         "bcast": True, "wide": True, "addressed": True},
    # GPUs: 4 lanes per row (head dim split, dots summed with subgroup shuffles), 2 rows per lane,
    # 64 rows per workgroup, BC-row tiles of the streamed operand in shared memory, unrolled loops.
    "tiled": {"tiled": True, "tpr": 4, "rq": 2, "wg": 128, "kb": 2, "kb_bwd": 2, "bc": 32, "unroll": True},
}
KERNEL_VARIANTS = with_dtypes(VARIANTS)  # what the kernels declare: VARIANTS for f32, bf16 and fp16


class _WideBuffer:
    """A buffer declared as u64 whose `.vec4[i]` moves four floats as two 64-bit words (wide.WideView):
    Mesa 22's lavapipe loads buffer data one component per invocation in a scalar loop, so this halves
    the cost of every load."""

    def __init__(self, b: KernelBuilder, binding: int, dtype: str = "f32", addressed: bool = False) -> None:
        buf = b.buffer(binding, u64, "r", addressed)
        self.vec4 = WideView(b, buf, dtype)


def input_buffer(b: KernelBuilder, v: Variant, binding: int):
    """A read-only buffer of the variant's dtype read as vec4<f32>s (as u64 words on "wide" variants)."""
    dtype = variant_dtype(v.params)
    if v.get("wide"):
        return _WideBuffer(b, binding, dtype, addressed(v))
    return b.buffer(binding, storage(dtype), "r", addressed(v))


def output_buffer(b: KernelBuilder, v: Variant, binding: int):
    """A write-only buffer of the variant's dtype (o, dqkv): vec4<f32> stores, rounded once when half."""
    return b.buffer(binding, storage(variant_dtype(v.params)), "w", addressed(v))


def addressed(v: Variant) -> bool:
    """Whether the variant reads and writes its buffers through device addresses (its f32 ones too)."""
    return bool(v.get("addressed"))


def rows_per_group(v: Variant | dict | str) -> int:
    """Rows one workgroup owns (v: a variant, its params, or its name in KERNEL_VARIANTS)."""
    p = KERNEL_VARIANTS[v] if isinstance(v, str) else v.params if isinstance(v, Variant) else v
    return p["wg"] // p["tpr"] * p["rq"]


def spec_values(variant: str, head_dim: int, causal: bool, softcap: float, dropout_p: float,
                min_subgroup: int = 4) -> dict:
    """Specialization constants of a launch (they pick code paths, so they key the pipeline).
    min_subgroup: the device's smallest subgroup size (bcast slots per lane are sized for it)."""
    p = KERNEL_VARIANTS[variant]
    d4 = head_dim // 4
    nv = ceil_div(d4, p["tpr"])
    sg = max(1, min(min_subgroup, p["wg"]))
    slots, slots_bwd = ceil_div(p["kb"] * d4, sg), ceil_div(p["kb_bwd"] * d4, sg)
    return {"D4": d4, "NV": nv, "SLOTS": max(slots, slots_bwd), "SLOTS_BWD": slots_bwd,
            "TILE4": max(1, p["bc"]) * d4, "CAUSAL": bool(causal), "SOFTCAP": softcap > 0.0,
            "DROPOUT": dropout_p > 0.0}


@dataclass
class Decl:
    """The declarations every attention kernel shares (push constants and spec constants)."""

    T: Value
    H: Value
    Hkv: Value
    group: Value
    scale: Value
    cap: Value
    p_drop: Value
    inv_keep: Value
    seed: Value
    offset: Value
    D4: Value
    NV: Value
    SLOTS: Value
    SLOTS_BWD: Value
    TILE4: Value
    causal: Value
    softcap: Value
    dropout: Value


def declare(b: KernelBuilder, counter_binding: int) -> Decl:
    """Push constants (shapes and scalars) and spec constants (head dim and code-path switches).

    The dropout offset is the push constant plus element 0 of the u32 buffer at `counter_binding` (the RNG
    counter, kernels/lib/rng.py): a captured step reads its per-pass counter from there, not from a baked push."""
    T, H, Hkv, group = (b.push(n, u32) for n in ("T", "H", "Hkv", "group"))
    scale, cap, p_drop, inv_keep = (b.push(n, f32) for n in ("scale", "softcap", "dropout_p", "inv_keep"))
    seed, offset = b.push("seed", u32), b.push("offset", u32) + b.buffer(counter_binding, u32, "r")[0]
    D4, NV, TILE4 = b.spec("D4", u32, 16), b.spec("NV", u32, 16), b.spec("TILE4", u32, MAX_D4)
    SLOTS, SLOTS_BWD = b.spec("SLOTS", u32, 16), b.spec("SLOTS_BWD", u32, 16)
    causal, softcap, dropout = (b.spec(n, boolean, d) for n, d in (("CAUSAL", True), ("SOFTCAP", False),
                                                                    ("DROPOUT", False)))
    return Decl(T, H, Hkv, group, scale, cap, p_drop, inv_keep, seed, offset, D4, NV, SLOTS, SLOTS_BWD, TILE4,
                causal, softcap, dropout)


@dataclass
class Rows:
    """Where this invocation sits: its RQ rows, its lane, and the workgroup's (row block, head, batch)."""

    block: Value
    head: Value
    batch: Value
    rows: list  # RQ consecutive rows; may be >= T (padding: computed on a clamped row, never written)
    rows_c: list  # min(row, T - 1)
    lane: Value
    R: int  # rows per workgroup
    first: Value  # the first row of this invocation's subgroup-independent span (rows[0])
    last: Value  # rows[-1]


def rows(b: KernelBuilder, v: Variant, d: Decl) -> Rows:
    """Grid (row blocks, heads, batch); the row/lane split of the workgroup."""
    b.local_size(v.wg)
    R = rows_per_group(v)
    if v.tpr == 1:
        g, lane = b.local_id(0), b.const(0, u32)
    else:
        # Number the invocations by subgroup so that a row's lanes share a subgroup whatever the
        # driver's local-id -> subgroup mapping (the workgroup size is a multiple of the subgroup size).
        flat = b.subgroup_id() * b.subgroup_size() + b.subgroup_local_id()
        g, lane = flat / v.tpr, flat % v.tpr
    block = b.workgroup_id(0)
    first = block * R + g * v.rq
    rs = [first + r for r in range(v.rq)]
    return Rows(block, b.workgroup_id(1), b.workgroup_id(2), rs, [b.min(x, d.T - 1) for x in rs], lane, R,
                rs[0], rs[-1])


def lane_reduce(b: KernelBuilder, v: Variant, x: Value) -> Value:
    """Sum of x over the TPR lanes of a row (they are adjacent in one subgroup)."""
    mask = 1
    while mask < v.tpr:
        x = x + b.subgroup_shuffle_xor(x, mask)
        mask *= 2
    return x


def comp(b: KernelBuilder, v: Variant, d: Decl, lane: Value, t: Value) -> tuple[Value, Value]:
    """(component index c = lane + TPR*t clamped to D4 - 1, c < D4) of register slot t."""
    if v.tpr == 1:
        return t, b.const(True, boolean)
    c = lane + t * v.tpr
    return b.min(c, d.D4 - 1), c < d.D4


def load_rows(b: KernelBuilder, v: Variant, d: Decl, src, bases: list, lane: Value, regs, mul=None) -> None:
    """regs[r][t] <- the lane's components of row r, which starts at vec4 bases[r] of src (0 past D4)."""
    with reg_loop(b, v, d) as t:
        c, ok = comp(b, v, d, lane, t)
        for r, base in enumerate(bases):
            x = src.vec4[base + c]
            if mul is not None:
                x = x * mul
            regs[r][t] = x if v.tpr == 1 else b.select(ok, x, b.splat(0.0, 4))


@contextmanager
def reg_loop(b: KernelBuilder, v: Variant, d: Decl):
    """Loop over a lane's register slots t < NV: unrolled for "tiled" (registers on GPUs); for "rowwise" a
    real loop marked DontUnroll, since lavapipe's compile time explodes on the unrolled RQ-row bodies
    (16 s instead of 2 s at RQ = 8) and indexing its register arrays dynamically costs little there."""
    with b.for_range(0, d.NV, unroll=bool(v.unroll)) as t:
        yield t


def zero_regs(b: KernelBuilder, v: Variant, d: Decl, *arrays) -> None:
    with reg_loop(b, v, d) as t:
        for rows_ in arrays:
            for a in rows_:
                a[t] = b.splat(0.0, 4)


def row_regs(b: KernelBuilder, v: Variant, d: Decl, name: str) -> list:
    """One NV-slot vec4 register array per row of the invocation (regs[r][t]). Separate small arrays,
    not one RQ * NV array: lavapipe's compile time grows with the size of dynamically indexed arrays."""
    return [b.local_array(vec4, d.NV, f"{name}{r}") for r in range(v.rq)]


class Stream:
    """The streamed operand rows (K and V, or Q and dO), KB rows per step, read one of three ways:

    - in place, each invocation loading what it uses ("rowwise" on a device without subgroup broadcast);
    - "bcast" ("rowwise"): the subgroup loads each step's KB rows once, spread over its lanes (SLOTS vec4s
      per lane), and every lane takes the components it needs with subgroup broadcasts. On lavapipe a
      buffer load costs a per-lane loop while a broadcast is a vector extract, so this cuts the dominant
      cost by the subgroup size. Needs subgroup-uniform loop bounds (all lanes active at a broadcast);
    - "tiled": BC-row tiles staged in shared memory by the workgroup (barriers: workgroup-uniform bounds).
    `at(k, j, c)` is component c of row j of operand k within the current step or tile.
    """

    def __init__(self, b: KernelBuilder, v: Variant, d: Decl, src, bases: list[Value], stride: Value) -> None:
        self.b, self.v, self.d, self.src, self.bases, self.stride = b, v, d, src, bases, stride
        self.shared = [b.shared(vec4, d.TILE4, f"tile{k}") for k in range(len(bases))] if v.tiled else None
        self.bcast = bool(v.get("bcast")) and not v.tiled
        if self.bcast:
            self.slots = [b.local_array(vec4, d.SLOTS, f"slots{k}") for k in range(len(bases))]
            # a workgroup smaller than the subgroup fills only its first wg lanes
            self.sg, self.sl = b.min(b.subgroup_size(), v.wg), b.subgroup_local_id()
        self.t0 = None

    def row_scalar(self, buf, base: Value, j0: Value, u: int, T: Value) -> Value:
        """buf[base + min(j0 + u, T - 1)], a per-row scalar of the step's row u: with bcast, lane u loads it
        and the others take it by broadcast (one buffer load per subgroup instead of one per lane)."""
        b = self.b
        if not self.bcast:
            return buf[base + b.min(j0 + u, T - 1)]
        mine = buf[base + b.min(j0 + self.sl % self.kb, T - 1)]
        if u == 0:
            return b.subgroup_broadcast(mine, u)
        # Lane u exists only in subgroups wider than u: narrower ones (4 lanes, KB = 8) load row u in every
        # lane instead. The branch is subgroup-uniform and never taken where the subgroup holds KB lanes.
        value = b.var(f32, b.subgroup_broadcast(mine, b.min(b.const(u, u32), self.sg - 1)))
        with b.if_(self.sg <= u):
            value.value = buf[base + b.min(j0 + u, T - 1)]
        return value.value

    def load(self, k: int, row: Value, c: Value) -> Value:
        """Component c of row `row` of operand k, from the device buffer."""
        return self.src.vec4[self.bases[k] + row * self.stride + c]

    def at(self, k: int, j: Value, c: Value) -> Value:
        """Component c of row j (clamped for plain "rowwise", unclamped otherwise) of operand k."""
        if self.bcast:
            e = (j - self.t0) * self.d.D4 + c
            # e is the same in every lane (uniform j and c), so its lane is a valid broadcast id
            return self.b.subgroup_broadcast(self.slots[k][e / self.sg], e % self.sg)
        if self.shared is None:
            return self.load(k, j, c)
        return self.shared[k][(j - self.t0) * self.d.D4 + c]

    def _stage(self, j0: Value, kb: int, T: Value) -> None:
        """bcast: lane l loads vec4s e = s * SG + l (s < SLOTS) of rows j0 .. j0 + kb - 1, clamped to T - 1."""
        b, d = self.b, self.d
        self.t0 = j0
        # slot counts are spec constants (a known trip count): SLOTS for KB rows, SLOTS_BWD for KB_BWD
        with b.for_range(0, d.SLOTS if kb == self.v.kb else d.SLOTS_BWD) as s:
            e = s * self.sg + self.sl
            row = b.min(j0 + e / d.D4, T - 1)
            c = e % d.D4
            for k in range(len(self.bases)):
                self.slots[k][s] = self.load(k, row, c)

    def run(self, lo: Value, hi: Value, step_fn, T: Value, kb: int | None = None) -> None:
        """Call step_fn(j0) for j0 = lo, lo + KB, ... < hi, with rows j0 .. j0 + KB - 1 readable.

        lo and hi must be workgroup-uniform for "tiled", subgroup-uniform for bcast.
        """
        b, v, d = self.b, self.v, self.d
        kb = self.kb = kb or v.kb
        if self.shared is None:
            with b.for_range(lo, hi, step=kb) as j0:
                if self.bcast:
                    self._stage(j0, kb, T)
                step_fn(j0)
            return
        with b.for_range(lo, hi, step=v.bc) as t0:
            self.t0 = t0
            n = v.bc * d.D4
            with b.for_range(b.local_index(), n, step=v.wg) as e:
                jj, c = e / d.D4, e % d.D4
                row = b.min(t0 + jj, T - 1)
                for k in range(len(self.bases)):
                    self.shared[k][e] = self.load(k, row, c)
            b.barrier()
            nk = b.min(hi - t0, v.bc)
            with b.for_range(0, nk, step=kb) as jj0:
                step_fn(t0 + jj0)
            b.barrier()


def key_index(b: KernelBuilder, j0: Value, u: int, T: Value) -> tuple[Value, Value]:
    """(row j0 + u, that row clamped to T - 1)."""
    j = j0 + u
    return j, b.min(j, T - 1)


def tile_row(stream: Stream, j: Value, jc: Value) -> Value:
    """The row index `at` expects: staged rows (tiles, bcast slots) are clamped when staged, so j itself."""
    return jc if stream.shared is None and not stream.bcast else j


def uniform_bounds(b: KernelBuilder, v: Variant, lo: Value, hi: Value) -> tuple[Value, Value]:
    """Loop bounds every lane that must cooperate agrees on: the subgroup's min/max for bcast."""
    if v.get("bcast") and not v.tiled:
        return b.subgroup_min(lo), b.subgroup_max(hi)
    return lo, hi
