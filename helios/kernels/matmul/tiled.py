"""Shared-memory tiled matmul with register blocking: the fast kind on real GPUs.

A workgroup computes a BM x BN block of C. For each BK slice of K, its invocations copy an A tile (BM x BK)
and a B tile (BK x BN) into shared memory, both stored k-major (`As[k][m]`, `Bs[k][n]`) whatever the
global layout, so the compute loop is the same for every layout; then each invocation accumulates a
TM x TN register block from shared memory. Global loads move 4 consecutive elements of an operand's
contiguous dimension per unit (one vec4 when `vec=4`), clamped into the matrix; elements past K are
zeroed (they would otherwise add garbage), rows past M and columns past N are never stored.

Invocation (tx, ty) owns rows `ty + i * (BM / TM)` and columns `tx + j * (BN / TN)`: neighbouring
invocations read neighbouring shared words (no bank conflicts) and store neighbouring columns of C.
Variant parameters: layout, bm, bn, bk, tm, tn, vec.
"""

from __future__ import annotations

from contextlib import nullcontext

from helios.kernels.matmul.common import Operands, contiguous, declare, store_block
from helios.spirv import KernelBuilder, Variant, ceil_div, f32


def _load_tile(b: KernelBuilder, buf, sh, base, ld, tid, threads: int, idx0, extent, k0, K, rows: int,
               bk: int, along_k: bool, vec: int) -> None:
    """Copy the rows x bk tile at (idx0.., k0..) of an operand into sh[k * rows + r], zero past K.

    An operand element (r, k) is at base + r*ld + k (along_k) or base + k*ld + r (contiguous along r).
    """
    if along_k:
        per_line = bk // 4
        units = rows * per_line
    else:
        per_line = rows // 4
        units = bk * per_line
    for t in range(ceil_div(units, threads)):
        u = tid + t * threads if t else tid
        with b.if_(u < units) if (t + 1) * threads > units else nullcontext():
            _load_unit(b, buf, sh, base, ld, u, per_line, idx0, extent, k0, K, rows, along_k, vec)


def _load_unit(b: KernelBuilder, buf, sh, base, ld, u, per_line: int, idx0, extent, k0, K, rows: int,
               along_k: bool, vec: int) -> None:
    """Copy one unit: 4 consecutive elements of the operand's contiguous dimension."""
    line, q = u / per_line, u % per_line
    if along_k:
        r, kq = line, q * 4
        row_off = base + b.min(idx0 + r, extent - 1) * ld
        k = k0 + kq
        if vec == 4:
            v = buf.vec4[(row_off + b.min(k, K - 4)) >> 2]
            vals = [v[c] for c in range(4)]
            inside = [k < K] * 4
        else:
            vals = [buf[row_off + b.min(k + c, K - 1)] for c in range(4)]
            inside = [k + c < K if c else k < K for c in range(4)]
        for c in range(4):
            sh[(kq + c) * rows + r] = b.select(inside[c], vals[c], 0.0)
    else:
        k, r = line, q * 4
        k_off = base + b.min(k0 + k, K - 1) * ld
        inside = k0 + k < K
        if vec == 4:
            v = buf.vec4[(k_off + b.min(idx0 + r, extent - 4)) >> 2]
            vals = [v[c] for c in range(4)]
        else:
            vals = [buf[k_off + b.min(idx0 + r + c, extent - 1)] for c in range(4)]
        for c in range(4):
            sh[k * rows + r + c] = b.select(inside, vals[c], 0.0)


def build_tiled(b: KernelBuilder, v: Variant) -> None:
    """Shared-memory tiled matmul: workgroup (gx, gy, z) owns a BM x BN block of batch entry z."""
    bm, bn, bk, tm, tn, vec = v.bm, v.bn, v.bk, v.tm, v.tn, v.vec
    cols_t, rows_t = bn // tn, bm // tm
    threads = cols_t * rows_t
    b.local_size(threads)
    o: Operands = declare(b, v)
    a_dim, b_dim = contiguous(v.layout)
    tid = b.local_id(0)
    tx, ty = tid % cols_t, tid / cols_t
    z = b.workgroup_id(2)
    n_blk, m_blk = b.workgroup_id(0) * bn, b.workgroup_id(1) * bm
    sa, sb = b.shared(f32, bk * bm, "tile_a"), b.shared(f32, bk * bn, "tile_b")
    acc = [[b.var(f32, 0.0) for _ in range(tn)] for _ in range(tm)]
    abase, bbase = z * o.sa, z * o.sb
    with b.for_range(0, o.K, step=bk) as k0:
        _load_tile(b, o.a, sa, abase, o.lda, tid, threads, m_blk, o.M, k0, o.K, bm, bk, a_dim == "k", vec)
        _load_tile(b, o.b, sb, bbase, o.ldb, tid, threads, n_blk, o.N, k0, o.K, bn, bk, b_dim == "k", vec)
        b.barrier()
        for kk in range(bk):
            av = [sa[ty + (kk * bm + i * rows_t)] for i in range(tm)]
            bv = [sb[tx + (kk * bn + j * cols_t)] for j in range(tn)]
            for i in range(tm):
                for j in range(tn):
                    acc[i][j].value = b.fma(av[i], bv[j], acc[i][j].value)
        b.barrier()
    store_block(b, o, acc, m_blk + ty, n_blk + tx, z * o.sc, row_step=rows_t, col_step=cols_t)


def tiled_block(params: dict) -> tuple[int, int]:
    """(rows, columns) of C one workgroup of a shared-memory (or cooperative-matrix) tiling computes: bm x bn."""
    return params["bm"], params["bn"]


def tiled_grid(shape: tuple[int, ...], variant: Variant) -> tuple[int, int, int]:
    """Workgroups for shape = (M, N, batch): one per tiled_block of each batch entry's output."""
    M, N, batch = shape
    bm, bn = tiled_block(variant.params)
    return ceil_div(N, bn), ceil_div(M, bm), batch


# name -> parameters (layout and vec are added per kernel); small/medium/large block tiles.
TILED_TILINGS = {
    "tiled32": {"bm": 32, "bn": 32, "bk": 8, "tm": 4, "tn": 4},
    "tiled64": {"bm": 64, "bn": 64, "bk": 16, "tm": 4, "tn": 4},
    "tiled128": {"bm": 128, "bn": 128, "bk": 8, "tm": 8, "tn": 8},
}
TILED_BLOCKS = {name: tiled_block(p) for name, p in TILED_TILINGS.items()}  # what matmul.select's table reads
