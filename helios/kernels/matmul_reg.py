"""Register-blocked matmul without shared memory: each invocation owns a TM x TN block of C.

The fast kind on lavapipe, where shared memory and barriers are ~25x slower than registers: llvmpipe runs
8 invocations side by side in one AVX2 register, so a kernel with no barriers and many independent
FMAs per loaded value is what it compiles best. Every load goes through a clamped index (rows past M and
columns past N re-read the last valid one; their results are never stored), so the inner loop has no
branches. K runs in steps of 4 (unrolled) and then a scalar tail for K % 4.

`vec=4` loads operands as vec4s along their contiguous dimension; it needs every leading dimension and
batch stride to be a multiple of 4 (the op picks `vec=1` otherwise). Variant parameters: layout, tm, tn
(the block per invocation), wx, wy (the workgroup), vec.
"""

from __future__ import annotations

from helios.kernels.matmul_common import Operands, contiguous, declare, store_block
from helios.spirv import KernelBuilder, Variant, f32


class _Operand:
    """Loads of one operand (A or B) for a register block: `rows` are its M (or N) indices, clamped."""

    def __init__(self, b: KernelBuilder, buf, base, ld, idx0, count: int, extent, along_k: bool, vec: int):
        self.b, self.buf, self.ld, self.count, self.along_k, self.vec = b, buf, ld, count, along_k, vec
        last = extent - 1
        if along_k:
            # Element (r, k) at base + r*ld + k: one row offset per block row.
            self.offsets = [base + b.min(idx0 + r if r else idx0, last) * ld for r in range(count)]
            if vec == 4:
                self.offsets4 = [off >> 2 for off in self.offsets]
        elif vec == 4:
            # Element (r, k) at base + k*ld + r, read as vec4 groups of 4 rows; groups past the end
            # re-read the last full group (extent is a multiple of 4 when vec == 4).
            self.offsets = [base + b.min(idx0 + 4 * q if q else idx0, extent - 4) for q in range(count // 4)]
        else:
            self.offsets = [base + b.min(idx0 + r if r else idx0, last) for r in range(count)]

    def step4(self, k4) -> list[list]:
        """values[r][kk] for k = 4*k4 + kk, kk < 4."""
        buf = self.buf
        vals: list[list] = [[None] * 4 for _ in range(self.count)]
        if self.along_k:
            for r in range(self.count):
                if self.vec == 4:
                    v = buf.vec4[self.offsets4[r] + k4]
                    for kk in range(4):
                        vals[r][kk] = v[kk]
                else:
                    k = k4 * 4
                    for kk in range(4):
                        vals[r][kk] = buf[self.offsets[r] + k + kk if kk else self.offsets[r] + k]
            return vals
        for kk in range(4):
            koff = (k4 * 4 + kk) * self.ld if kk else k4 * 4 * self.ld
            self._rows_at(koff, vals, kk)
        return vals

    def step1(self, k) -> list:
        """values[r] at a single k (the K % 4 tail)."""
        if self.along_k:
            return [self.buf[off + k] for off in self.offsets]
        vals: list[list] = [[None] for _ in range(self.count)]
        self._rows_at(k * self.ld, vals, 0)
        return [v[0] for v in vals]

    def _rows_at(self, koff, vals: list[list], kk: int) -> None:
        """Fill vals[r][kk] with the contiguous row values at k offset koff."""
        if self.vec == 4:
            for q, off in enumerate(self.offsets):
                v = self.buf.vec4[(off + koff) >> 2]
                for c in range(4):
                    vals[4 * q + c][kk] = v[c]
        else:
            for r, off in enumerate(self.offsets):
                vals[r][kk] = self.buf[off + koff]


def build_reg(b: KernelBuilder, v: Variant) -> None:
    """Register-blocked matmul: invocation (x, y) of group (gx, gy, z) owns rows m0.., columns n0.. of batch z."""
    tm, tn, wx, wy, vec = v.tm, v.tn, v.wx, v.wy, v.vec
    b.local_size(wx, wy)
    o: Operands = declare(b)
    a_dim, b_dim = contiguous(v.layout)
    z = b.workgroup_id(2)
    n0 = (b.workgroup_id(0) * wx + b.local_id(0)) * tn
    m0 = (b.workgroup_id(1) * wy + b.local_id(1)) * tm
    A = _Operand(b, o.a, z * o.sa, o.lda, m0, tm, o.M, a_dim == "k", vec)
    B = _Operand(b, o.b, z * o.sb, o.ldb, n0, tn, o.N, b_dim == "k", vec)
    acc = [[b.var(f32, 0.0) for _ in range(tn)] for _ in range(tm)]

    def fma_block(av: list, bv: list) -> None:
        for i in range(tm):
            for j in range(tn):
                acc[i][j].value = b.fma(av[i], bv[j], acc[i][j].value)

    k4_end = o.K >> 2
    with b.for_range(0, k4_end) as k4:
        av, bv = A.step4(k4), B.step4(k4)
        for kk in range(4):
            fma_block([row[kk] for row in av], [col[kk] for col in bv])
    with b.for_range(k4_end * 4, o.K) as k:
        fma_block(A.step1(k), B.step1(k))
    store_block(b, o, acc, m0, n0, z * o.sc)


def reg_grid(M: int, N: int, batch: int, v: Variant) -> tuple[int, int, int]:
    """Workgroups for an M x N output per batch entry."""
    return -(-N // (v.tn * v.wx)), -(-M // (v.tm * v.wy)), batch


# name -> parameters (layout and vec are added per kernel); small/medium/large blocks.
REG_TILINGS = {
    "reg4x4": {"tm": 4, "tn": 4, "wx": 8, "wy": 8},
    "reg8x8": {"tm": 8, "tn": 8, "wx": 8, "wy": 8},
    "reg8x16": {"tm": 8, "tn": 16, "wx": 8, "wy": 8},
}
