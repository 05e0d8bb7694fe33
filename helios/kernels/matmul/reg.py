"""Register-blocked matmul without shared memory: each invocation owns a TM x TN block of C.

The fast kind on lavapipe, where shared memory and barriers are ~25x slower than registers. llvmpipe runs
8 invocations side by side in one AVX2 register and (Mesa 22) loads storage buffers one component per
invocation in a scalar loop, so loads cost far more than FMAs. Three things cut them:
- big blocks per invocation (TM x TN accumulators: more FMAs per loaded value; spills are cheap next to
  buffer loads);
- `share`: the workgroup is one row of `wx` invocations that own the same rows of C, so they split the A
  loads between them and pass the values round with subgroup broadcasts instead of each loading all of A.
  That needs the workgroup to be a single subgroup: the op uses it only where the subgroup size is at
  least wx (a workgroup smaller than the subgroup is one partial subgroup);
- `wide`: vec4s are moved as 64-bit words (two for f32, one for 4 bf16/fp16; see matmul_common.Vec4Loader).

Every load goes through a clamped index (rows past M and columns past N re-read the last valid one; their
results are never stored), so the loop has no branches. K runs in steps of 4: operands contiguous along K
are loaded as one vec4 per row per step, then a (not unrolled) loop over the 4 k's does the FMAs, which
keeps the shader, and lavapipe's JIT time, 4x smaller than a fully unrolled step. A scalar tail handles
K % 4. `vec=4` loads vec4s along each operand's contiguous dimension and needs those dimensions to be
multiples of 4 (the op picks `vec=1` otherwise).
"""

from __future__ import annotations

from helios.kernels.contract.dtypes import variant_dtype
from helios.kernels.matmul.common import (
    SOLO,
    Operands,
    Slot,
    Vec4Loader,
    c_dtype,
    contiguous,
    declare,
    init_block,
    store_block,
    store_rows,
)
from helios.spirv import KernelBuilder, Value, Variant, boolean, ceil_div, f32, vec

F32X4 = vec(f32, 4)


class _Operand:
    """Loads of one operand (A or B) for an invocation's block of `count` rows (of M, or of N for B).

    Element (r, k) is at base + r*ld + k when the operand is contiguous along K, else base + k*ld + r.
    Sharing (lanes > 1): the `lanes` invocations of the workgroup (one subgroup) own the same rows; the
    loads of the block ("units": a row, or a vec4 of 4 rows along a contiguous M or N) are dealt out
    round-robin over the lanes and every invocation collects them by subgroup broadcasts.
    """

    def __init__(self, b: KernelBuilder, buf, base, ld, idx0, count: int, extent, along_k: bool, vec: int,
                 wide: bool, lanes: int = 1, dtype: str = "f32"):
        self.b, self.buf, self.ld, self.count, self.along_k, self.vec = b, buf, ld, count, along_k, vec
        self.lanes = lanes
        self.vec4 = Vec4Loader(b, buf, wide, dtype) if vec == 4 else None
        quads = vec == 4 and not along_k  # units are vec4s of 4 rows along a contiguous M or N
        self.per_unit = 4 if quads else 1
        self.units = total = count // self.per_unit
        self.lane = None
        if lanes == 1:
            units = list(range(total))
        else:
            # The lane id the broadcasts address: the workgroup is one subgroup (matmul_select.reg_ok), but
            # Vulkan does not promise that local id x is subgroup lane x, so loads are dealt by lane id.
            self.lane = lane = b.subgroup_local_id()
            units = [(lane + lanes * s) % total if s else lane % total for s in range(ceil_div(total, lanes))]
        self.unit_rows, self.offsets = [], []  # per slot: the unit's first row (unclamped), its offset at k = 0
        for u in units:
            row = idx0 + u * self.per_unit if not isinstance(u, int) or u else idx0
            self.unit_rows.append(row)
            self.offsets.append(self._unit_offset(base, ld, row, extent, quads))
        self.loaded: list[Value] = []  # this invocation's own loads at the last `at` or `tail` (before broadcasts)

    def owns(self, slot: int) -> Value | None:
        """Whether this invocation's load slot `slot` is its own unit (None: always), not a re-load of another
        lane's: with sharing, a slot whose unit wrapped round (lane + lanes * slot >= units) repeats one."""
        if self.lanes == 1:
            return None
        return self.lane + self.lanes * slot < self.units

    def _unit_offset(self, base, ld, row, extent, quads: bool):
        """Offset at k = 0 of the unit whose first row is `row`, clamped into the matrix."""
        b = self.b
        if quads:  # groups past the end re-read the last full group (extent % 4 == 0)
            return base + b.min(row, extent - 4)
        row = b.min(row, extent - 1)
        return base + row * ld if self.along_k else base + row

    def _collect(self, loaded: list[Value]) -> list[Value]:
        """The block's units, in row order, from what each lane loaded (unit u: lane u % lanes, slot u // lanes)."""
        self.loaded = loaded
        if self.lanes == 1:
            return loaded
        return [self.b.subgroup_broadcast(loaded[u // self.lanes], u % self.lanes) for u in range(self.units)]

    def _quad(self, off) -> Value:
        """4 consecutive elements from `off` as a vec4 (one vec4 load, or 4 scalar loads)."""
        if self.vec == 4:
            return self.vec4[off >> 2]
        b, buf = self.b, self.buf
        return b.vector(*(buf[off + c if c else off] for c in range(4)))

    def prefetch(self, k) -> list[Value] | None:
        """For an operand contiguous along K: per block row, the vec4 of k .. k+3 (k a multiple of 4)."""
        if not self.along_k:
            return None
        return self._collect([self._quad(off + k) for off in self.offsets])

    def at(self, pre: list[Value] | None, kk, k) -> list[Value]:
        """Per block row, the value at k (= prefetch's k + kk for operands contiguous along K)."""
        if pre is not None:
            return [v[kk] for v in pre]
        koff = k * self.ld
        if self.vec == 4:
            quads = self._collect([self.vec4[(off + koff) >> 2] for off in self.offsets])
            return [q[c] for q in quads for c in range(4)]
        return self._collect([self.buf[off + koff] for off in self.offsets])

    def tail(self, k) -> list[Value]:
        """Per block row, the value at a single k of the K % 4 tail."""
        if self.along_k:
            return self._collect([self.buf[off + k] for off in self.offsets])
        return self.at(None, None, k)


def build_reg(b: KernelBuilder, v: Variant, slot: Slot = SOLO) -> None:
    """Register-blocked matmul: invocation (x, y) of group (gx, gy, z) owns rows m0.., columns n0.. of batch z.

    With sharing the workgroup is one row of wx lanes that own the same tm rows (and different columns).
    A two-dimensional arrangement of the lanes (sharing B as well, picking each lane's values with
    selects) was measured 1.4-1.6x slower on lavapipe: the broadcasts and selects cost more than the
    loads they save. `slot`: where the product sits in its kernel (a pair's builder sets the local size).
    """
    tm, tn, wx, wy, vec = v.tm, v.tn, v.wx, v.wy, v.vec
    share, wide = v.get("share", False), v.get("wide", False)
    if slot.groups is None:
        b.local_size(wx, wy)
    o: Operands = declare(b, v, slot)
    a_dim, b_dim = contiguous(v.layout)
    dtype = variant_dtype(v.params)
    z = slot.workgroup_id(b, 2)
    n0 = (slot.workgroup_id(b, 0) * wx + b.local_id(0)) * tn
    m0 = (slot.workgroup_id(b, 1) * wy + b.local_id(1)) * tm
    A = _Operand(b, o.a, z * o.sa, o.lda, m0, tm, o.M, a_dim == "k", vec, wide, wx if share else 1, dtype)
    B = _Operand(b, o.b, z * o.sb, o.ldb, n0, tn, o.N, b_dim == "k", vec, wide, dtype=dtype)
    acc = [[b.var(f32, 0.0) for _ in range(tn)] for _ in range(tm)]
    init_block(b, o, acc, m0, n0, z * o.sc)  # a later K chunk of the op's continues the sums it is given
    sums = _ASums(b, v, o, A, slot) if takes_a_sums(v) else None

    def fma_block(av: list, bv: list) -> None:
        for i in range(tm):
            for j in range(tn):
                acc[i][j].value = b.fma(av[i], bv[j], acc[i][j].value)

    k4_end = o.K >> 2
    with b.for_range(0, k4_end) as k4:
        k = k4 * 4
        pa, pb = A.prefetch(k), B.prefetch(k)
        if v.get("k_inner", False):
            # Each accumulator takes its 4 k's in a row: a spilled accumulator is loaded and stored once per 4 FMAs
            # instead of per FMA. Same k order per element, so the same sums bit for bit.
            av = []
            for kk in range(4):
                av.append(A.at(pa, kk, k + kk if kk else k))
                if sums:
                    sums.add(A.loaded)
            bv = [B.at(pb, kk, k + kk if kk else k) for kk in range(4)]
            for i in range(tm):
                for j in range(tn):
                    t = acc[i][j].value
                    for kk in range(4):
                        t = b.fma(av[kk][i], bv[kk][j], t)
                    acc[i][j].value = t
        else:
            with b.for_range(0, 4) as kk:
                av = A.at(pa, kk, k + kk)
                if sums:
                    sums.add(A.loaded)
                fma_block(av, B.at(pb, kk, k + kk))
    with b.for_range(k4_end * 4, o.K) as k:
        av = A.tail(k)
        if sums:
            sums.add(A.loaded)
        fma_block(av, B.tail(k))
    if sums:
        sums.store()
    if v.get("row_store", False) and c_dtype(v) == "f32":
        store_rows(b, o, acc, m0, n0, z * o.sc)
    else:
        store_block(b, o, acc, m0, n0, z * o.sc)


A_SUMS_BINDING = 6  # after common.declare's six


def bindings(v: Variant) -> int:
    """How many bindings a register tiling's kernel declares: common.declare's six, and the column sums of A."""
    return A_SUMS_BINDING + takes_a_sums(v)


def takes_a_sums(v: Variant) -> bool:
    """Whether a matmul variant declares binding 6 and can sum A's columns (_ASums): register tilings' tn kernels."""
    return v.kind == "reg" and v.layout == "tn"


class _ASums:
    """A tn product's optional column sums of A ([K, M]): sums[m] (+)= sum over k of A(k, m), which is a Linear's
    bias gradient beside its weight gradient dW = dY^T X, in the same dispatch (spec constant A_SUMS; A_SUMS_ADD
    adds into binding 6, else stores). Each lane adds the A values it loads itself, before the broadcasts, so a
    row of A is summed by one lane, k = 0, 1, ... in order from 0: the order of `reduce.sum_rows` in one pass, bit
    for bit. Every workgroup sums (a branch per k would cost more than the adds); the first column of workgroups
    stores. Unbatched products only (the op's rule)."""

    def __init__(self, b: KernelBuilder, v: Variant, o: Operands, a: _Operand, slot: Slot = SOLO):
        self.b, self.o, self.a = b, o, a
        self.out = b.buffer(slot.binding + A_SUMS_BINDING, f32, "rw")
        self.on = b.spec(slot.prefix + "A_SUMS", boolean, False)
        self.add_into = b.spec(slot.prefix + "A_SUMS_ADD", boolean, False)
        self.regs = [b.var(F32X4 if a.per_unit == 4 else f32, 0.0) for _ in a.offsets]
        self.first_column = slot.workgroup_id(b, 0).eq(0)
        if a.lanes == 1:  # every invocation of the workgroup loads the whole block: the first one stores
            self.first_column = self.first_column & b.local_id(0).eq(0)

    def add(self, loaded: list[Value]) -> None:
        with self.b.if_(self.on):
            for reg, value in zip(self.regs, loaded, strict=True):
                reg.value = reg.value + value

    def store(self) -> None:
        b, o, a = self.b, self.o, self.a
        with b.if_(self.on & self.first_column):
            for slot, (reg, row0) in enumerate(zip(self.regs, a.unit_rows, strict=True)):
                owned = a.owns(slot)
                for c in range(a.per_unit):
                    row = row0 + c if c else row0
                    keep = row < o.M if owned is None else owned & (row < o.M)
                    with b.if_(keep):
                        total = reg.value[c] if a.per_unit == 4 else reg.value
                        with b.if_(self.add_into):
                            self.out[row] = self.out[row] + total
                        with b.else_():
                            self.out[row] = total


def reg_block(params: dict) -> tuple[int, int]:
    """(rows, columns) of C one workgroup of a register tiling computes: (tm * wy) x (tn * wx)."""
    return params["tm"] * params["wy"], params["tn"] * params["wx"]


def reg_grid(shape: tuple[int, ...], variant: Variant) -> tuple[int, int, int]:
    """Workgroups for shape = (M, N, batch): one per reg_block of each batch entry's output."""
    M, N, batch = shape
    bm, bn = reg_block(variant.params)
    return ceil_div(N, bn), ceil_div(M, bm), batch


# name -> parameters (layout and vec are added per kernel): small, medium and large blocks, and the
# addressed blocks (reg12x8a, reg32x8ak) that CPU drivers with device addresses run.
# Bigger blocks load less per FMA but JIT superlinearly slower on lavapipe (cold compile of one pipeline,
# measured: 8x8 0.4 s, 16x16 2.2 s, 32x16 11 s, 64x16 73 s; Mesa's disk cache makes later runs instant),
# so 32x16 is the largest offered.
REG_TILINGS = {
    "reg8x8": {"tm": 8, "tn": 8, "wx": 8, "wy": 1, "share": True, "wide": True},
    "reg16x16": {"tm": 16, "tn": 16, "wx": 8, "wy": 1, "share": True, "wide": True},
    "reg32x16": {"tm": 32, "tn": 16, "wx": 8, "wy": 1, "share": True, "wide": True},
    "reg12x8a": {"tm": 12, "tn": 8, "wx": 8, "wy": 1, "share": True, "wide": True, "addressed": True},
    "reg32x8ak": {"tm": 32, "tn": 8, "wx": 8, "wy": 1, "share": True, "wide": True, "addressed": True,
                  "k_inner": True, "c_addressed": True, "row_store": True},
}
REG_BLOCKS = {name: reg_block(p) for name, p in REG_TILINGS.items()}  # what matmul.select's table reads
# reg12x8a: with A and B read through device addresses a lane's own loads are gathers, no longer a bounds-checked
# per-lane loop, so loads stop dominating and a block whose 96 accumulators spill less wins: on lavapipe 25,
# 1.4x the table's descriptor-bound tilings over the default config's training shapes (docs/BENCHMARKS.md).
# reg32x8ak: the same loads, with the 4 k's of a step unrolled and taken per accumulator (`k_inner`). llvmpipe's
# JIT spills any block over ~24 accumulators, so k-outer order loads and stores every accumulator at every k (2.3
# stack accesses per 8-lane FMA in reg12x8a's loop, GALLIVM_DEBUG=asm); k-inner order does it once per 4 k's (1.1
# with its 256 accumulators), so the bigger block (half the gathers per FMA) wins: 1.3-1.5x reg12x8a on the GPT
# shapes (docs/BENCHMARKS.md, "Matmul against the FMA ceiling"). It also stores C through its address
# (`c_addressed`): a store is then a scatter, not a bounds-checked loop over the lanes (the stores were ~15% of the
# kernel at K = 128; 3-9% faster there), and a row of 8 columns inside C as two vec4s (`row_store`, f32 C only:
# another 4-5%). Its cold compile on Mesa 25: ~0.5 s.
