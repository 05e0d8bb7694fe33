"""Half-precision matmul on the GPU's matrix units (VK_KHR_cooperative_matrix): fp16 A and B, fp32
accumulation, fp32 C with the same fused epilogue as every other matmul (bias, GELU with the
pre-activation stored, residual, alpha, beta * C).

A workgroup computes a BM x BN block of C with WM x WN subgroups; each subgroup owns a (BM/WM) x (BN/WN)
region held as 16 x 16 accumulator tiles. Per BK slice of K, the workgroup stages A's and B's tiles in
shared memory with bounds-checked loads (zeros outside the matrix, so every shape works), in one
row-major layout whatever the operands' layout (nn, nt, tn, tt), then each subgroup multiplies from
shared memory. The epilogue goes through a per-subgroup 16 x 16 scratch tile in shared memory, since
which lane holds which element of a cooperative matrix is opaque.

Only devices that report fp16 x fp16 -> fp32 16x16x16 subgroup matrices run it (`supported`); lavapipe
has none, so on CI the kernels are built and spirv-val'd only. numpy reference: matmul.reference on the
fp16-rounded inputs.
"""

from __future__ import annotations

import numpy as np

from helios.kernels import selection
from helios.kernels.matmul_common import LAYOUTS, PUSH_FIELDS, Operands, a_index, b_index, epilogue, launch_params
from helios.kernels.matmul_tiled import tiled_grid
from helios.spirv import Kernel, KernelBuilder, Variant, boolean, ceil_div, f16, f32, u32
from helios.spirv.coopmat import coopmat

TILE = 16  # the M = N = K tile every cooperative-matrix GPU offers for fp16 x fp16 -> fp32
SUBGROUP = 32  # the subgroup size the tilings assume (NVIDIA; RDNA3 in wave32 mode)
TILINGS = {  # block of C per workgroup, K slice, subgroups along M and N
    "cm64": {"bm": 64, "bn": 64, "bk": 32, "wm": 2, "wn": 2},
    "cm128": {"bm": 128, "bn": 128, "bk": 32, "wm": 2, "wn": 4},
}


def supported(info) -> bool:
    """Whether this device multiplies 16x16x16 fp16 subgroup matrices into fp32 (and runs 32-lane subgroups)."""
    shapes = getattr(info, "cooperative_matrix", ()) or ()
    want = (TILE, TILE, TILE, "f16", "f16", "f32")
    return (want in {tuple(s[:6]) for s in shapes} and info.min_subgroup_size <= SUBGROUP <= info.max_subgroup_size
            and info.float16 and info.storage_16bit)


def _declare(b: KernelBuilder) -> Operands:
    bufs = [b.buffer(0, f16, "r"), b.buffer(1, f16, "r"), b.buffer(2, f32, "rw"),
            b.buffer(3, f32, "r"), b.buffer(4, f32, "r"), b.buffer(5, f32, "w")]
    push = {name: b.push(name, f32 if name in ("alpha", "beta") else u32) for name in PUSH_FIELDS}
    flags = {name: b.spec(name, boolean, False) for name in ("HAS_BIAS", "GELU", "STORE_PREACT", "HAS_RESIDUAL",
                                                             "HAS_BETA")}
    return Operands(*bufs, **push, flags=flags)


def build(b: KernelBuilder, v: Variant) -> None:
    bm, bn, bk, wm, wn = v.bm, v.bn, v.bk, v.wm, v.wn
    threads = wm * wn * SUBGROUP
    sub_m, sub_n = bm // wm // TILE, bn // wn // TILE  # accumulator tiles per subgroup, along M and N
    b.local_size(threads)
    o = _declare(b)
    A, B, C = coopmat(f16, TILE, TILE, "a"), coopmat(f16, TILE, TILE, "b"), coopmat(f32, TILE, TILE, "acc")
    a_tile = b.shared(f16, bm * bk, "a_tile")  # row-major [bm][bk]
    b_tile = b.shared(f16, bk * bn, "b_tile")  # row-major [bk][bn]
    scratch = b.shared(f32, wm * wn * TILE * TILE, "scratch")  # one 16x16 tile per subgroup

    tid = b.local_index()
    sg = tid / SUBGROUP
    lane = tid % SUBGROUP
    sg_m, sg_n = sg / wn, sg % wn
    m0 = b.workgroup_id(1) * bm
    n0 = b.workgroup_id(0) * bn
    z = b.workgroup_id(2)
    abase, bbase, cbase = z * o.sa, z * o.sb, z * o.sc
    acc = [[b.var(C, b.coopmat_fill(C, 0.0)) for _ in range(sub_n)] for _ in range(sub_m)]
    zero = b.const(0.0, f16)

    with b.for_range(0, o.K, step=bk) as k0:
        with b.for_range(tid, bm * bk, step=threads) as e:  # stage A(m0.., k0..) with zeros outside
            r, c = e / bk, e % bk
            m, k = m0 + r, k0 + c
            inside = (m < o.M) & (k < o.K)
            a_tile[e] = b.select(inside, o.a[abase + b.select(inside, a_index(o, v.layout, m, k), 0)], zero)
        with b.for_range(tid, bk * bn, step=threads) as e:  # stage B(k0.., n0..)
            r, c = e / bn, e % bn
            k, n = k0 + r, n0 + c
            inside = (k < o.K) & (n < o.N)
            b_tile[e] = b.select(inside, o.b[bbase + b.select(inside, b_index(o, v.layout, k, n), 0)], zero)
        b.barrier()
        for kk in range(bk // TILE):
            a_frags = [b.coopmat_load(A, a_tile, (sg_m * sub_m + i) * TILE * bk + kk * TILE, bk) for i in range(sub_m)]
            for j in range(sub_n):
                bf = b.coopmat_load(B, b_tile, kk * TILE * bn + (sg_n * sub_n + j) * TILE, bn)
                for i in range(sub_m):
                    acc[i][j].value = b.coopmat_muladd(a_frags[i], bf, acc[i][j].value)
        b.barrier()

    base = sg * (TILE * TILE)
    for i in range(sub_m):
        for j in range(sub_n):
            b.coopmat_store(scratch, base, acc[i][j].value, TILE)
            b.barrier()
            row0 = m0 + (sg_m * sub_m + i) * TILE
            col0 = n0 + (sg_n * sub_n + j) * TILE
            with b.for_range(lane, TILE * TILE, step=SUBGROUP) as e:
                row, col = row0 + e / TILE, col0 + e % TILE
                with b.if_((row < o.M) & (col < o.N)):
                    epilogue(b, o, scratch[base + e], row, col, cbase)
            b.barrier()


def flops(M: int, N: int, K: int, batch: int = 1) -> int:
    return 2 * M * N * K * batch


def nbytes(M: int, N: int, K: int, batch: int = 1) -> int:
    """Compulsory traffic: fp16 A and B read once, fp32 C written once."""
    return (2 * (M * K + K * N) + 4 * M * N) * batch


KERNELS = {
    layout: Kernel(f"matmul_coopmat_{layout}", build,
                   variants={name: {"layout": layout, **p} for name, p in TILINGS.items()},
                   grid=tiled_grid, flops=flops, bytes=nbytes, requires=("cooperative_matrix",))  # bm x bn blocks
    for layout in LAYOUTS
}


@selection.rule("matmul_coopmat", choices=("cm64", "cm128"))
def choose(info, shape: tuple, dtype: str = "fp16", forced: str | None = None) -> str | None:
    """The tiling for shape = (M, N, K, batch) on this device (the forced one if any), or None where the
    matrix units cannot run it."""
    M, N, _K, batch = shape
    if not supported(info):
        return None
    if forced is not None:
        return forced
    blocks_128 = ceil_div(M, 128) * ceil_div(N, 128) * batch
    return "cm128" if blocks_128 >= 132 else "cm64"  # enough 128-blocks to fill an H100's 132 SMs


def reference(a: np.ndarray, b: np.ndarray, trans_a: bool = False, trans_b: bool = False, **epilogue_args):
    """The op's definition: matmul.reference on the inputs rounded to fp16, computed in float64."""
    from helios.kernels.matmul import reference as fp32_reference

    a16, b16 = (np.asarray(x, np.float16).astype(np.float64) for x in (a, b))
    return fp32_reference(a16, b16, trans_a, trans_b, **epilogue_args)


def matmul_half(a, b, trans_a: bool = False, trans_b: bool = False, bias=None, gelu: bool = False, residual=None,
                out=None, beta: float = 0.0, alpha: float = 1.0, preact_out=None, tiling: str | None = None):
    """`matmul` on the matrix units: a and b float16 tensors, C and the epilogue tensors float32.

    Raises HeliosError on a device without fp16 cooperative matrices (lavapipe): check `supported` first.
    """
    from helios.device import get_device
    from helios.errors import HeliosError
    from helios.kernels.matmul import _dims
    from helios.runtime import empty, launch

    info = get_device().info
    batch, M, N, K = _dims(a, b, trans_a, trans_b)
    for name, t, want in (("a", a, np.float16), ("b", b, np.float16), ("bias", bias, np.float32),
                          ("residual", residual, np.float32), ("out", out, np.float32),
                          ("preact_out", preact_out, np.float32)):
        if t is not None and t.dtype != want:
            raise TypeError(f"matmul_half: {name} must be {np.dtype(want).name}, got {t.dtype}")
    tiling = tiling or selection.choose("matmul_coopmat", (M, N, K, batch), "fp16", info)
    if tiling is None:
        raise HeliosError(f"the device '{info.name}' has no fp16 cooperative matrices (VK_KHR_cooperative_matrix "
                          "16x16x16 f16 -> f32); use the float32 matmul")
    if beta != 0.0 and out is None:
        raise ValueError("matmul_half: beta != 0 accumulates into `out`, which was not given")
    c = out if out is not None else empty((batch, M, N) if (a.ndim == 3 or b.ndim == 3) else (M, N))
    if batch * M * N == 0:
        return c
    layout = ("t" if trans_a else "n") + ("t" if trans_b else "n")
    kernel = KERNELS[layout]
    push, spec = launch_params(a, b, M, N, K, bias, gelu, residual, preact_out, beta, alpha)
    buffers = [a, b, c, bias if bias is not None else c, residual if residual is not None else c,
               preact_out if preact_out is not None else c]
    launch(kernel, buffers=buffers, push=push, grid=kernel.grid_for((M, N, batch), tiling), spec=spec,
           variant=tiling)
    return c
