"""Half-precision matmul on the GPU's matrix units (VK_KHR_cooperative_matrix): fp16 or bf16 A and B, fp32
accumulation, fp32 C with the same fused epilogue as every other matmul (bias, GELU with the pre-activation
stored, residual, alpha, beta * C).

A workgroup computes a BM x BN block of C with WM x WN subgroups of the device's subgroup size S (the local size
WM * WN * S is the spec constant THREADS, set at launch; subgroup and lane ids come from the builtins, so any S
from 4 to 64 works). Each subgroup owns a (BM/WM) x (BN/WN) region held as 16 x 16 accumulator tiles. Per BK
slice of K, the workgroup stages A's and B's tiles in shared memory with bounds-checked loads (zeros outside the
matrix, so every shape works), in one row-major layout whatever the operands' layout (nn, nt, tn, tt), then each
subgroup multiplies from shared memory. The epilogue goes through a per-subgroup 16 x 16 scratch tile in shared
memory, since which lane holds which element of a cooperative matrix is opaque. bf16 operands are staged as
their 16-bit patterns.

Each tiling comes native (the matrix units' instructions) and emulated (`<tiling>_emulated`: the same kernel
with the cooperative-matrix ops lowered to plain SPIR-V, helios/spirv/coopmat_emulated.py). The rule picks
native variants only on real matrix units and emulated ones only where DeviceInfo.cooperative_matrix_emulated
(the GPU profile on lavapipe, or HELIOS_COOPMAT=emulate); an emulated tiling may also be asked for by name.
numpy reference: matmul.reference on the fp16- or bf16-rounded inputs.
"""

from __future__ import annotations

from collections.abc import Iterator

import ml_dtypes
import numpy as np

from helios.kernels import selection
from helios.kernels.matmul_common import LAYOUTS, PUSH_FIELDS, Operands, a_index, b_index, epilogue, launch_params
from helios.kernels.matmul_tiled import tiled_grid
from helios.spirv import Kernel, KernelBuilder, Value, Variant, bf16, boolean, ceil_div, f16, f32, u16, u32
from helios.spirv.coopmat import coopmat

TILE = 16  # the M = N = K tile every cooperative-matrix GPU offers for half inputs -> fp32
SUBGROUP_SIZES = (4, 64)  # the subgroup sizes the kernels are written for (the emulation needs >= 4 lanes)
TILINGS = {  # block of C per workgroup, K slice, subgroups along M and N
    "cm64": {"bm": 64, "bn": 64, "bk": 32, "wm": 2, "wn": 2},
    "cm128": {"bm": 128, "bn": 128, "bk": 32, "wm": 2, "wn": 4},
}
EMULATED = "_emulated"  # the suffix of an emulated tiling's name
CHOICES = (*TILINGS, *(t + EMULATED for t in TILINGS))
DTYPES = {"fp16": f16, "bf16": bf16}  # the operands' type -> the matrices' element type
HOST_DTYPES = {"fp16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}


def offered(info, dtype: str = "fp16") -> bool:
    """Whether the device lists 16x16x16 dtype x dtype -> f32 subgroup matrices (real or emulated)."""
    elem = DTYPES[dtype].name
    shapes = getattr(info, "cooperative_matrix", ()) or ()
    return (TILE, TILE, TILE, elem, elem, "f32") in {tuple(s[:6]) for s in shapes}


def runs(info, dtype: str, emulated: bool) -> bool:
    """Whether this device can run the dtype kernels lowered this way (whatever the rule would pick)."""
    lo, hi = SUBGROUP_SIZES
    if not (lo <= info.subgroup_size <= hi and info.storage_16bit):
        return False
    if dtype == "fp16" and not info.float16:  # f16 buffers and shared tiles
        return False
    if emulated:  # operands gathered by subgroup broadcast; bf16 staged as u16 patterns
        return "ballot" in info.subgroup_ops and (dtype != "bf16" or info.int16)
    # Native bf16 needs VK_KHR_shader_bfloat16 enabled at device creation, which helios.device does not do yet.
    return offered(info, dtype) and not info.cooperative_matrix_emulated and dtype == "fp16"


def supported(info, dtype: str = "fp16") -> bool:
    """Whether the rule picks a cooperative-matrix tiling for dtype on this device: real matrix units that offer
    16x16x16 dtype -> f32, or the emulated ones where DeviceInfo.cooperative_matrix_emulated; subgroups of 4 to 64."""
    return offered(info, dtype) and runs(info, dtype, bool(info.cooperative_matrix_emulated))


def _declare(b: KernelBuilder, dtype: str) -> Operands:
    half = DTYPES[dtype]
    bufs = [b.buffer(0, half, "r"), b.buffer(1, half, "r"), b.buffer(2, f32, "rw"),
            b.buffer(3, f32, "r"), b.buffer(4, f32, "r"), b.buffer(5, f32, "w")]
    push = {name: b.push(name, f32 if name in ("alpha", "beta") else u32) for name in PUSH_FIELDS}
    flags = {name: b.spec(name, boolean, False) for name in ("HAS_BIAS", "GELU", "STORE_PREACT", "HAS_RESIDUAL",
                                                             "HAS_BETA")}
    return Operands(*bufs, **push, flags=flags)


def build(b: KernelBuilder, v: Variant) -> None:
    bm, bn, bk, wm, wn = v.bm, v.bn, v.bk, v.wm, v.wn
    b.coopmat_lowering(v.coopmat)
    threads = b.spec("THREADS", u32, wm * wn * 32)  # wm * wn subgroups of the device's size (launch sets it)
    sub_m, sub_n = bm // wm // TILE, bn // wn // TILE  # accumulator tiles per subgroup, along M and N
    b.local_size(threads)
    o = _declare(b, v.dtype)
    elem = DTYPES[v.dtype]
    A, B, C = coopmat(elem, TILE, TILE, "a"), coopmat(elem, TILE, TILE, "b"), coopmat(f32, TILE, TILE, "acc")
    # bf16 operands are staged as their bit patterns (the DSL's bf16 is a storage type that loads as f32)
    staged = f16 if v.dtype == "fp16" else u16
    a_src = o.a if v.dtype == "fp16" else o.a.view_as(u16)
    b_src = o.b if v.dtype == "fp16" else o.b.view_as(u16)
    a_tile = b.shared(staged, bm * bk, "a_tile")  # row-major [bm][bk]
    b_tile = b.shared(staged, bk * bn, "b_tile")  # row-major [bk][bn]
    scratch = b.shared(f32, wm * wn * TILE * TILE, "scratch")  # one 16x16 tile per subgroup

    tid = b.local_index()
    sg, lane, lanes = b.subgroup_id(), b.subgroup_local_id(), b.subgroup_size()
    sg_m, sg_n = sg / wn, sg % wn
    m0 = b.workgroup_id(1) * bm
    n0 = b.workgroup_id(0) * bn
    z = b.workgroup_id(2)
    abase, bbase, cbase = z * o.sa, z * o.sb, z * o.sc
    acc = _Accumulators(b, C, sub_m * sub_n, unrolled=v.coopmat == "native")
    zero = b.const(0.0, f16) if staged == f16 else b.cast(b.const(0, u32), u16)  # no u16 literals in SPIR-V here

    with b.for_range(0, o.K, step=bk) as k0:
        with b.for_range(tid, bm * bk, step=threads) as e:  # stage A(m0.., k0..) with zeros outside
            r, c = e / bk, e % bk
            m, k = m0 + r, k0 + c
            inside = (m < o.M) & (k < o.K)
            a_tile[e] = b.select(inside, a_src[abase + b.select(inside, a_index(o, v.layout, m, k), 0)], zero)
        with b.for_range(tid, bk * bn, step=threads) as e:  # stage B(k0.., n0..)
            r, c = e / bn, e % bn
            k, n = k0 + r, n0 + c
            inside = (k < o.K) & (n < o.N)
            b_tile[e] = b.select(inside, b_src[bbase + b.select(inside, b_index(o, v.layout, k, n), 0)], zero)
        b.barrier()
        for kk in range(bk // TILE):
            if acc.unrolled:  # A's fragments stay in registers across the row of B tiles
                a_frags = [b.coopmat_load(A, a_tile, (sg_m * sub_m + i) * TILE * bk + kk * TILE, bk)
                           for i in range(sub_m)]
                for j in range(sub_n):
                    bf = b.coopmat_load(B, b_tile, kk * TILE * bn + (sg_n * sub_n + j) * TILE, bn)
                    for i in range(sub_m):
                        acc[i * sub_n + j] = b.coopmat_muladd(a_frags[i], bf, acc[i * sub_n + j])
            else:
                for t in acc.each():
                    i, j = t / sub_n, t % sub_n
                    af = b.coopmat_load(A, a_tile, (sg_m * sub_m + i) * TILE * bk + kk * TILE, bk)
                    bf = b.coopmat_load(B, b_tile, kk * TILE * bn + (sg_n * sub_n + j) * TILE, bn)
                    acc[t] = b.coopmat_muladd(af, bf, acc[t])
        b.barrier()

    base = sg * (TILE * TILE)
    for t in acc.each():
        i, j = t // sub_n, t % sub_n
        b.coopmat_store(scratch, base, acc[t], TILE)
        b.barrier()
        row0 = m0 + (sg_m * sub_m + i) * TILE
        col0 = n0 + (sg_n * sub_n + j) * TILE
        with b.for_range(lane, TILE * TILE, step=lanes) as e:
            row, col = row0 + e / TILE, col0 + e % TILE
            with b.if_((row < o.M) & (col < o.N)):
                epilogue(b, o, scratch[base + e], row, col, cbase)
        b.barrier()


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


def flops(M: int, N: int, K: int, batch: int = 1) -> int:
    return 2 * M * N * K * batch


def nbytes(M: int, N: int, K: int, batch: int = 1) -> int:
    """Compulsory traffic: half-precision A and B read once, fp32 C written once."""
    return (2 * (M * K + K * N) + 4 * M * N) * batch


def _variants(layout: str, dtype: str) -> dict:
    native = {name: {"layout": layout, "dtype": dtype, "coopmat": "native", **p} for name, p in TILINGS.items()}
    emulated = {name + EMULATED: {**p, "coopmat": "emulated"} for name, p in native.items()}
    return {**native, **emulated}


KERNELS = {  # dtype -> layout -> kernel; each tiling native and emulated
    dtype: {layout: Kernel(f"matmul_coopmat_{layout}" if dtype == "fp16" else f"matmul_coopmat_{dtype}_{layout}",
                           build, variants=_variants(layout, dtype), grid=tiled_grid, flops=flops, bytes=nbytes,
                           requires=("cooperative_matrix",))  # bm x bn blocks
            for layout in LAYOUTS}
    for dtype in DTYPES
}


@selection.rule("matmul_coopmat", choices=CHOICES)
def choose(info, shape: tuple, dtype: str = "fp16", forced: str | None = None) -> str | None:
    """The tiling for shape = (M, N, K, batch) in dtype ("fp16" or "bf16") on this device: native on real matrix
    units, emulated where DeviceInfo.cooperative_matrix_emulated; a forced one where this device can run it; None
    where neither can run."""
    M, N, _K, batch = shape
    if dtype not in DTYPES:
        raise ValueError(f"matmul_coopmat multiplies {' or '.join(DTYPES)} operands, not {dtype!r}")
    if forced is not None:
        return forced if runs(info, dtype, forced.endswith(EMULATED)) else None
    if not supported(info, dtype):
        return None
    blocks_128 = ceil_div(M, 128) * ceil_div(N, 128) * batch
    tiling = "cm128" if blocks_128 >= 132 else "cm64"  # enough 128-blocks to fill an H100's 132 SMs
    return tiling + (EMULATED if info.cooperative_matrix_emulated else "")


def reference(a: np.ndarray, b: np.ndarray, trans_a: bool = False, trans_b: bool = False, dtype: str = "fp16",
              **epilogue_args):
    """The op's definition: matmul.reference on the inputs rounded to dtype (fp16 or bf16), in float64."""
    from helios.kernels.matmul import reference as fp32_reference

    half = HOST_DTYPES[dtype]
    a16, b16 = (np.asarray(x).astype(half).astype(np.float64) for x in (a, b))
    return fp32_reference(a16, b16, trans_a, trans_b, **epilogue_args)


def matmul_half(a, b, trans_a: bool = False, trans_b: bool = False, bias=None, gelu: bool = False, residual=None,
                out=None, beta: float = 0.0, alpha: float = 1.0, preact_out=None, tiling: str | None = None):
    """`matmul` on the matrix units: a and b both float16 or both bfloat16 tensors, C and the epilogue tensors
    float32. `tiling` names one of CHOICES (an emulated one runs on any device that `runs` it).

    Raises HeliosError on a device without cooperative matrices for the operands' type: check `supported` first.
    """
    from helios.device import get_device
    from helios.errors import HeliosError
    from helios.kernels.matmul import _dims
    from helios.runtime import empty, launch

    info = get_device().info
    batch, M, N, K = _dims(a, b, trans_a, trans_b)
    dtype = next((name for name, host in HOST_DTYPES.items() if a.dtype == host), None)
    if dtype is None:
        raise TypeError(f"matmul_half: a must be float16 or bfloat16, got {a.dtype}")
    for name, t, want in (("b", b, HOST_DTYPES[dtype]), ("bias", bias, np.float32),
                          ("residual", residual, np.float32), ("out", out, np.float32),
                          ("preact_out", preact_out, np.float32)):
        if t is not None and t.dtype != want:
            raise TypeError(f"matmul_half: {name} must be {np.dtype(want).name}, got {t.dtype}")
    if tiling is not None and tiling not in CHOICES:
        raise ValueError(f"matmul_half: unknown tiling {tiling!r} (tilings: {', '.join(CHOICES)})")
    if tiling is not None and not runs(info, dtype, tiling.endswith(EMULATED)):
        raise HeliosError(f"the device '{info.name}' cannot run the {dtype} cooperative-matrix tiling {tiling!r} "
                          "(see matmul_coopmat.runs); use the float32 matmul")
    tiling = tiling or selection.choose("matmul_coopmat", (M, N, K, batch), dtype, info)
    if tiling is None:
        raise HeliosError(f"the device '{info.name}' has no {dtype} cooperative matrices (VK_KHR_cooperative_matrix "
                          f"16x16x16 {DTYPES[dtype].name} -> f32); use the float32 matmul")
    if beta != 0.0 and out is None:
        raise ValueError("matmul_half: beta != 0 accumulates into `out`, which was not given")
    c = out if out is not None else empty((batch, M, N) if (a.ndim == 3 or b.ndim == 3) else (M, N))
    if batch * M * N == 0:
        return c
    layout = ("t" if trans_a else "n") + ("t" if trans_b else "n")
    kernel = KERNELS[dtype][layout]
    push, spec = launch_params(a, b, M, N, K, bias, gelu, residual, preact_out, beta, alpha)
    v = kernel.variant(tiling)
    spec = {**(spec or {}), "THREADS": v.wm * v.wn * info.subgroup_size}  # wm * wn subgroups
    buffers = [a, b, c, bias if bias is not None else c, residual if residual is not None else c,
               preact_out if preact_out is not None else c]
    launch(kernel, buffers=buffers, push=push, grid=kernel.grid_for((M, N, batch), tiling), spec=spec,
           variant=tiling)
    return c
