"""Cooperative-matrix tilings of the matmul op (helios/kernels/matmul/__init__.py): bf16 or fp16 A and B on the GPU's
matrix units (VK_KHR_cooperative_matrix), f32 accumulation, C rounded once when stored in its dtype, with the
same fused epilogue as every other matmul tiling (matmul_common.declare and epilogue).

A workgroup computes a BM x BN block of C with WM x WN working subgroups. Each owns a (BM/WM) x (BN/WN) region
held as 16 x 16 accumulator tiles. The local size is the spec constant THREADS = WM * WN * the device's largest
subgroup size (set at launch): where the driver runs narrower subgroups (an AMD card may run 32 or 64 lanes)
the workgroup holds more subgroups than WM * WN, and those beyond only stage and wait at barriers, so the
kernel is correct at any executed size from coopmat_support.SUBGROUP_SIZES[0] to max_subgroup_size.

K runs in BK slices, double buffered as the fast Vulkan engines do it: two shared slots per operand; while the
subgroups multiply slice k from one slot, every invocation stages slice k+1 into the other, so one barrier per
slice orders both the staged data and the reuse of a slot. Staging is bounds-checked (zeros outside the matrix
and past K), in one row-major layout whatever the operands' layout (nn, nt, tn, tt), so every shape works
(edges, K not a multiple of 16). The double buffering is proved correct here (emulated); what it buys in speed
only a GPU can show. The epilogue goes through a per-subgroup 16 x 16 f32 scratch tile in shared memory, since
which lane holds which element of a cooperative matrix is opaque. bf16 operands are staged as 16-bit patterns.

Each tiling comes native (the matrix units' instructions) and emulated (`<tiling>_emulated`: the same kernel
with the cooperative-matrix ops lowered to plain SPIR-V, helios/spirv/coopmat_emulated.py). The "matmul" rule
(matmul/select.py) picks native tilings only on real matrix units and emulated ones only where
DeviceInfo.cooperative_matrix_emulated (the GPU profile on lavapipe, or HELIOS_COOPMAT=emulate); tests force
them with `selection.force("matmul", "cm64_emulated")`.
"""

from __future__ import annotations

from collections.abc import Iterator

from helios.kernels.lib import coopmat_support as support
from helios.kernels.lib.coopmat_support import TILE
from helios.kernels.matmul.common import a_index, b_index, declare, epilogue
from helios.spirv import KernelBuilder, Value, Variant, bf16, ceil_div, f16, f32, u16, u32
from helios.spirv.coopmat import coopmat

TILINGS = {  # block of C per workgroup, K slice, subgroups along M and N
    "cm64": {"bm": 64, "bn": 64, "bk": 32, "wm": 2, "wn": 2},
    # BK 16: two slots of 128 x 16 per operand and 8 scratch tiles fit 32 KiB of shared memory (lavapipe's)
    "cm128": {"bm": 128, "bn": 128, "bk": 16, "wm": 2, "wn": 4},
}
EMULATED = "_emulated"  # the suffix of an emulated tiling's name
CHOICES = (*TILINGS, *(t + EMULATED for t in TILINGS))
DTYPES = {"fp16": f16, "bf16": bf16}  # the operands' dtype -> the matrices' element type


def params(tiling: str) -> dict:
    """The variant parameters of a cooperative-matrix tiling (one of CHOICES): block sizes and lowering."""
    base = tiling.removesuffix(EMULATED)
    return {"kind": "coopmat", "coopmat": "emulated" if tiling.endswith(EMULATED) else "native", **TILINGS[base]}


def shared_bytes(tiling: str) -> int:
    """Shared memory of a tiling: two staging slots of A and B (16-bit) and one f32 scratch tile per subgroup."""
    p = TILINGS[tiling.removesuffix(EMULATED)]
    return 2 * 2 * (p["bm"] + p["bn"]) * p["bk"] + 4 * p["wm"] * p["wn"] * TILE * TILE


def runs(info, dtype: str, tiling: str) -> bool:
    """Whether this device can run tiling (one of CHOICES) for dtype operands, whatever the rule would pick."""
    return support.runs(info, dtype, shared_bytes(tiling), tiling.endswith(EMULATED))


def supported(info, dtype: str) -> bool:
    """Whether the rule picks cooperative-matrix tilings for dtype here: real matrix units that offer 16x16x16
    dtype -> f32, or the emulated ones where DeviceInfo.cooperative_matrix_emulated."""
    suffix = EMULATED if info.cooperative_matrix_emulated else ""
    return support.offered(info, dtype) and all(runs(info, dtype, t + suffix) for t in TILINGS)


def table_choice(info, M: int, N: int, batch: int) -> str:
    """The tiling for an M x N (x batch) output on a device where `supported`: cm128 where its blocks fill an
    H100's 132 multiprocessors, else cm64; emulated where the device's matrix units are the emulation."""
    tiling = "cm128" if ceil_div(M, 128) * ceil_div(N, 128) * batch >= 132 else "cm64"
    return tiling + (EMULATED if info.cooperative_matrix_emulated else "")


def threads(info, v: Variant) -> int:
    """The launch's THREADS: WM * WN subgroups of the widest size the driver may run (more, narrower subgroups
    where it runs narrower ones; those beyond WM * WN only stage)."""
    return v.wm * v.wn * info.max_subgroup_size


def build(b: KernelBuilder, v: Variant) -> None:
    """Cooperative-matrix matmul: workgroup (gx, gy, z) owns a BM x BN block of batch entry z."""
    bm, bn, bk, wm, wn = v.bm, v.bn, v.bk, v.wm, v.wn
    b.coopmat_lowering(v.coopmat)
    n_threads = b.spec("THREADS", u32, wm * wn * 32)  # at least wm * wn subgroups (launch sets it)
    sub_m, sub_n = bm // wm // TILE, bn // wn // TILE  # accumulator tiles per subgroup, along M and N
    b.local_size(n_threads)
    o = declare(b, v)
    elem = DTYPES[v.dtype]
    A, B, C = coopmat(elem, TILE, TILE, "a"), coopmat(elem, TILE, TILE, "b"), coopmat(f32, TILE, TILE, "acc")
    staged = f16 if v.dtype == "fp16" else u16  # bf16 staged as its bit patterns (the DSL's bf16 loads as f32)
    a_src, b_src = o.a.view_as(staged), o.b.view_as(staged)
    a_size, b_size = bm * bk, bk * bn
    a_tiles = b.shared(staged, 2 * a_size, "a_tiles")  # two slots of row-major [bm][bk]
    b_tiles = b.shared(staged, 2 * b_size, "b_tiles")  # two slots of row-major [bk][bn]
    scratch = b.shared(f32, wm * wn * TILE * TILE, "scratch")  # one 16x16 tile per working subgroup

    tid = b.local_index()
    sg, lane, lanes = b.subgroup_id(), b.subgroup_local_id(), b.subgroup_size()
    working = sg < wm * wn  # subgroup-uniform: the subgroups beyond wm * wn only stage
    sg_m, sg_n = sg / wn, sg % wn
    m0, n0, z = b.workgroup_id(1) * bm, b.workgroup_id(0) * bn, b.workgroup_id(2)
    abase, bbase, cbase = z * o.sa, z * o.sb, z * o.sc
    acc = _Accumulators(b, C, sub_m * sub_n, unrolled=v.coopmat == "native")
    zero = b.const(0.0, f16) if staged == f16 else b.cast(b.const(0, u32), u16)  # no u16 literals in SPIR-V here

    def stage(k0, slot) -> None:
        """Copy A(m0.., k0..) and B(k0.., n0..) into staging slot `slot`, zeros outside the matrices."""
        with b.for_range(tid, a_size, step=n_threads) as e:
            m, k = m0 + e / bk, k0 + e % bk
            inside = (m < o.M) & (k < o.K)
            a_tiles[slot * a_size + e] = b.select(
                inside, a_src[abase + b.select(inside, a_index(o, v.layout, m, k), 0)], zero)
        with b.for_range(tid, b_size, step=n_threads) as e:
            k, n = k0 + e / bn, n0 + e % bn
            inside = (k < o.K) & (n < o.N)
            b_tiles[slot * b_size + e] = b.select(
                inside, b_src[bbase + b.select(inside, b_index(o, v.layout, k, n), 0)], zero)

    def multiply(slot) -> None:
        """This subgroup's tiles += its rows of A's slot x its columns of B's slot."""
        a_at, b_at = slot * a_size, slot * b_size
        for kk in _k_tiles(b, bk // TILE, acc.unrolled):
            if acc.unrolled:  # A's fragments stay in registers across the row of B tiles
                a_frags = [b.coopmat_load(A, a_tiles, a_at + (sg_m * sub_m + i) * TILE * bk + kk * TILE, bk)
                           for i in range(sub_m)]
                for j in range(sub_n):
                    bf = b.coopmat_load(B, b_tiles, b_at + kk * TILE * bn + (sg_n * sub_n + j) * TILE, bn)
                    for i in range(sub_m):
                        acc[i * sub_n + j] = b.coopmat_muladd(a_frags[i], bf, acc[i * sub_n + j])
            else:
                for t in acc.each():
                    i, j = t / sub_n, t % sub_n
                    af = b.coopmat_load(A, a_tiles, a_at + (sg_m * sub_m + i) * TILE * bk + kk * TILE, bk)
                    bf = b.coopmat_load(B, b_tiles, b_at + kk * TILE * bn + (sg_n * sub_n + j) * TILE, bn)
                    acc[t] = b.coopmat_muladd(af, bf, acc[t])

    # Pass p stages slice p into slot p % 2 while the working subgroups multiply slice p-1 from the other slot;
    # one pass more than slices, so the staging and the product are each emitted once.
    with b.for_range(0, o.K + bk, step=bk) as k0:
        slice_no = k0 / bk
        with b.if_(k0 < o.K):
            stage(k0, slice_no % 2)
        with b.if_(working & (k0 > 0)):
            multiply((slice_no + 1) % 2)
        b.barrier()  # slice p staged, and slice p-1's slot free for slice p+1

    base = sg * (TILE * TILE)
    for t in acc.each():
        i, j = t // sub_n, t % sub_n
        with b.if_(working):
            b.coopmat_store(scratch, base, acc[t], TILE)
        b.barrier()
        with b.if_(working):
            row0 = m0 + (sg_m * sub_m + i) * TILE
            col0 = n0 + (sg_n * sub_n + j) * TILE
            with b.for_range(lane, TILE * TILE, step=lanes) as e:
                row, col = row0 + e / TILE, col0 + e % TILE
                with b.if_((row < o.M) & (col < o.N)):
                    epilogue(b, o, scratch[base + e], row, col, cbase)
        b.barrier()


def _k_tiles(b: KernelBuilder, count: int, unrolled: bool) -> Iterator:
    """The 16-wide K tiles of a slice: unrolled with the native accumulators, else a run-time loop (one copy of the
    emulated loads and MulAdd, not one per tile: cm64's two K tiles doubled its compile time on lavapipe)."""
    if unrolled:
        yield from range(count)
    else:
        with b.for_range(0, count) as kk:
            yield kk


class _Accumulators:
    """A subgroup's accumulator tiles: unrolled (native: each tile its own variable, every loop over them a Python
    loop) or in one function-local array walked by a run-time loop (emulated: one copy of the emulated MulAdd's
    code instead of one per tile, and tiles in memory rather than registers; lavapipe compiles the unrolled form of
    cm128 for minutes)."""

    def __init__(self, b: KernelBuilder, t, count: int, unrolled: bool) -> None:
        self.b, self.count, self.unrolled = b, count, unrolled
        zero = b.coopmat_fill(t, 0.0)
        if unrolled:
            self.tiles = [b.var(t, zero) for _ in range(count)]
        else:
            self.tiles = b.local_array(t, count, "acc")
            for k in self.each():
                self.tiles[k] = zero

    def each(self) -> Iterator:
        """The tiles' indices: Python ints when unrolled, else the counter of a run-time loop (the loop closes
        when the caller's loop body has run once)."""
        if self.unrolled:
            yield from range(self.count)
        else:
            with self.b.for_range(0, self.count) as k:
                yield k

    def __getitem__(self, k) -> Value:
        return self.tiles[k].value if self.unrolled else self.tiles[k]

    def __setitem__(self, k, value: Value) -> None:
        if self.unrolled:
            self.tiles[k].value = value
        else:
            self.tiles[k] = value
