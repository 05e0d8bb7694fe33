"""Flash-attention backward kernels (FlashAttention-2, two-kernel form: deterministic, no float atomics).

With P = exp(s - lse) recomputed per block, Z the dropout scale (keep / (1 - p) or 1) and
Delta_i = rowsum(dO_i * O_i) (preprocess kernel):
    dV_j += sum_i P_ij Z_ij dO_i,    dP_ij = Z_ij dO_i . V_j,    dS_ij = P_ij (dP_ij - Delta_i) [* (1 - tanh^2)],
    dQ_i = scale * sum_j dS_ij K_j  (query-parallel kernel),   dK_j = scale * sum_i dS_ij Q_i (key-parallel).
The key-parallel kernel loops over all query heads of its KV group, so dK/dV need no cross-invocation sum.
"""

from __future__ import annotations

from helios.kernels.attention_common import (
    VARIANTS,
    Stream,
    comp,
    declare,
    key_index,
    lane_reduce,
    load_rows,
    rows,
    rows_per_group,
    tile_row,
    vec4,
    zero_regs,
)
from helios.kernels.attention_forward import attention_flops, capped, dropped
from helios.spirv import Kernel, KernelBuilder, Variant, f32, u32

PRE_WG = 64


def build_preprocess(b: KernelBuilder, v: Variant) -> None:
    """delta[b, h, i] = dO_i . O_i. Bindings: 0 o [B, T, H D], 1 do (same), 2 delta [B, H, T] (w)."""
    o, do, delta = b.buffer(0, f32, "r"), b.buffer(1, f32, "r"), b.buffer(2, f32, "w")
    T, H = b.push("T", u32), b.push("H", u32)
    D4 = b.spec("D4", u32, 16)
    b.local_size(PRE_WG)
    i = b.workgroup_id(0) * PRE_WG + b.local_id(0)
    h, bb = b.workgroup_id(1), b.workgroup_id(2)
    with b.if_(i < T):
        base = ((bb * T + i) * H + h) * D4
        acc = b.var(f32, 0.0)
        with b.for_range(0, D4) as c:
            acc += b.dot(o.vec4[base + c], do.vec4[base + c])
        delta[(bb * H + h) * T + i] = acc.value


def _bwd_decl(b: KernelBuilder):
    qkv, lse, do = b.buffer(0, f32, "r"), b.buffer(1, f32, "r"), b.buffer(2, f32, "r")
    delta, dqkv = b.buffer(3, f32, "r"), b.buffer(4, f32, "w")
    return qkv, lse, do, delta, dqkv


def _prob_and_dscore(b, v, d, s_part, dp_part, lse_i, delta_i, ok, drop_row, drop_col):
    """(P * Z, dS) of one (query, key) pair from the lane-partial dots s = (scaled q) . k and dO . v."""
    s, th = capped(b, d, lane_reduce(b, v, s_part))
    p = b.select(ok, b.exp(s - lse_i), 0.0)
    z = dropped(b, d, b.const(1.0, f32), drop_row, drop_col)  # keep / (1 - p_drop), or 1 without dropout
    ds = p * (lane_reduce(b, v, dp_part) * z - delta_i)
    ds = b.select(d.softcap, ds * (1.0 - th * th), ds)
    return p * z, ds


def build_dq(b: KernelBuilder, v: Variant) -> None:
    """dQ, query-parallel: row i streams K/V. Bindings: qkv, lse, do, delta (r), dqkv (w, q part)."""
    qkv, lse, do, delta, dqkv = _bwd_decl(b)
    d = declare(b)
    rw = rows(b, v, d)
    T = d.T
    S4 = (d.H + d.Hkv * 2) * d.D4
    tok0 = rw.batch * T
    q, dov, dq = (b.local_array(vec4, d.NV, n) for n in ("q", "do", "dq"))
    load_rows(b, v, d, qkv, (tok0 + rw.row_c) * S4 + rw.head * d.D4, rw.lane, q, mul=d.scale)
    load_rows(b, v, d, do, (tok0 + rw.row_c) * (d.H * d.D4) + rw.head * d.D4, rw.lane, dov)
    zero_regs(b, d, dq)
    row_id = (rw.batch * d.H + rw.head) * T + rw.row_c
    lse_i, delta_i = lse[row_id], delta[row_id]
    kbase = tok0 * S4 + (d.H + rw.head / d.group) * d.D4
    stream = Stream(b, v, d, qkv, [kbase, kbase + d.Hkv * d.D4], S4)
    hi = b.select(d.causal, b.min(T, (rw.block + 1) * rw.R), T)
    drop_row = (rw.batch * d.H + rw.head) * T + rw.row

    def step(j0):
        js = [key_index(b, j0, u, T) for u in range(v.kb)]
        sp = [b.var(f32, 0.0) for _ in js]
        dp = [b.var(f32, 0.0) for _ in js]
        with b.for_range(0, d.NV, unroll=True) as t:
            c, _ = comp(b, v, d, rw.lane, t)
            qt, dot_ = q[t], dov[t]
            for u, (j, jc) in enumerate(js):
                r = tile_row(stream, j, jc)
                sp[u] += b.dot(qt, stream.at(0, r, c))
                dp[u] += b.dot(dot_, stream.at(1, r, c))
        dss = []
        for u, (j, _) in enumerate(js):
            ok = (j < T) & (~d.causal | (j <= rw.row))
            _, ds = _prob_and_dscore(b, v, d, sp[u].value, dp[u].value, lse_i, delta_i, ok, drop_row, j)
            dss.append(ds)
        with b.for_range(0, d.NV, unroll=True) as t:
            c, _ = comp(b, v, d, rw.lane, t)
            a = dq[t]
            for ds, (j, jc) in zip(dss, js, strict=True):
                a = a + stream.at(0, tile_row(stream, j, jc), c) * ds
            dq[t] = a

    stream.run(b.const(0, u32), hi, step, T)
    with b.if_(rw.row < T):
        base = (tok0 + rw.row) * S4 + rw.head * d.D4
        with b.for_range(0, d.NV, unroll=True) as t:
            c, ok = comp(b, v, d, rw.lane, t)
            with b.if_(ok):
                dqkv.vec4[base + c] = dq[t] * d.scale


def build_dkv(b: KernelBuilder, v: Variant) -> None:
    """dK/dV, key-parallel over KV heads: row j streams Q/dO of every query head of its group."""
    qkv, lse, do, delta, dqkv = _bwd_decl(b)
    d = declare(b)
    rw = rows(b, v, d)  # rw.head is the KV head here
    T = d.T
    S4 = (d.H + d.Hkv * 2) * d.D4
    HD4 = d.H * d.D4
    tok0 = rw.batch * T
    k, vv, dk, dv = (b.local_array(vec4, d.NV, n) for n in ("k", "v", "dk", "dv"))
    kbase = (tok0 + rw.row_c) * S4 + (d.H + rw.head) * d.D4
    load_rows(b, v, d, qkv, kbase, rw.lane, k, mul=d.scale)
    load_rows(b, v, d, qkv, kbase + d.Hkv * d.D4, rw.lane, vv)
    zero_regs(b, d, dk, dv)
    lo = b.select(d.causal, rw.block * rw.R, b.const(0, u32))  # rows i < the block's first key are masked
    with b.for_range(0, d.group) as hh:
        h = rw.head * d.group + hh
        stream = _QdoStream(b, v, d, qkv, do, tok0 * S4 + h * d.D4, tok0 * HD4 + h * d.D4, S4, HD4)
        row0 = (rw.batch * d.H + h) * T

        def step(i0):
            iis = [key_index(b, i0, u, T) for u in range(v.kb)]
            sp = [b.var(f32, 0.0) for _ in iis]
            dp = [b.var(f32, 0.0) for _ in iis]
            with b.for_range(0, d.NV, unroll=True) as t:
                c, _ = comp(b, v, d, rw.lane, t)
                kt, vt = k[t], vv[t]
                for u, (i, ic) in enumerate(iis):
                    r = tile_row(stream, i, ic)
                    sp[u] += b.dot(kt, stream.at(0, r, c))
                    dp[u] += b.dot(vt, stream.at(1, r, c))
            pzs, dss = [], []
            for u, (i, ic) in enumerate(iis):
                ok = (i < T) & (~d.causal | (i >= rw.row))
                pz, ds = _prob_and_dscore(b, v, d, sp[u].value, dp[u].value, lse[row0 + ic], delta[row0 + ic],
                                          ok, row0 + i, rw.row)
                pzs.append(pz)
                dss.append(ds)
            with b.for_range(0, d.NV, unroll=True) as t:
                c, _ = comp(b, v, d, rw.lane, t)
                ak, av = dk[t], dv[t]
                for pz, ds, (i, ic) in zip(pzs, dss, iis, strict=True):
                    r = tile_row(stream, i, ic)
                    ak = ak + stream.at(0, r, c) * ds
                    av = av + stream.at(1, r, c) * pz
                dk[t], dv[t] = ak, av

        stream.run(lo, T, step, T)
    with b.if_(rw.row < T):
        base = (tok0 + rw.row) * S4 + (d.H + rw.head) * d.D4
        with b.for_range(0, d.NV, unroll=True) as t:
            c, ok = comp(b, v, d, rw.lane, t)
            with b.if_(ok):
                dqkv.vec4[base + c] = dk[t] * d.scale
                dqkv.vec4[base + d.Hkv * d.D4 + c] = dv[t]


class _QdoStream(Stream):
    """Stream over query rows: operand 0 is q (in qkv, row stride S4), operand 1 is dO (row stride H*D4)."""

    def __init__(self, b, v, d, qkv, do, qbase, dobase, S4, HD4) -> None:
        super().__init__(b, v, d, None, [qbase, dobase], S4)
        self.srcs, self.strides = [qkv, do], [S4, HD4]

    def load(self, k, row, c):
        return self.srcs[k].vec4[self.bases[k] + row * self.strides[k] + c]


def backward_flops(B: int, T: int, H: int, D: int, causal: bool = True) -> float:
    """Algorithmic backward FLOPs (2.5x the forward, FlashAttention's convention; recompute not counted)."""
    return 2.5 * attention_flops(B, T, H, D, causal)


def pre_grid(B: int, T: int, H: int) -> tuple[int, int, int]:
    return (-(-T // PRE_WG), H, B)


def dkv_grid(B: int, T: int, Hkv: int, variant: str) -> tuple[int, int, int]:
    return (-(-T // rows_per_group(VARIANTS[variant])), Hkv, B)


ATTENTION_BACKWARD_PRE = Kernel(
    "attention_backward_preprocess", build_preprocess, variants={"vec4": {}}, grid=pre_grid,
    flops=lambda B, T, H, D: 2 * B * T * H * D, bytes=lambda B, T, H, D: 8 * B * T * H * D + 4 * B * H * T,
)
ATTENTION_BACKWARD_DQ = Kernel(
    "attention_backward_dq", build_dq, variants=VARIANTS, grid=lambda B, T, H, variant: (
        -(-T // rows_per_group(VARIANTS[variant])), H, B),
    flops=lambda B, T, H, D, causal=True: 1.5 * attention_flops(B, T, H, D, causal),
)
ATTENTION_BACKWARD_DKV = Kernel(
    "attention_backward_dkv", build_dkv, variants=VARIANTS, grid=dkv_grid,
    flops=lambda B, T, H, D, causal=True: 2.0 * attention_flops(B, T, H, D, causal),
)
