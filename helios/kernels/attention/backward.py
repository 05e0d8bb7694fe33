"""Flash-attention backward kernels (FlashAttention-2, two-kernel form: deterministic, no float atomics).

With P = exp(s - lse) recomputed per block, Z the dropout scale (keep / (1 - p) or 1) and
Delta_i = rowsum(dO_i * O_i) (preprocess kernel):
    dV_j += sum_i P_ij Z_ij dO_i,    dP_ij = Z_ij dO_i . V_j,    dS_ij = P_ij (dP_ij - Delta_i) [* (1 - tanh^2)],
    dQ_i = scale * sum_j dS_ij K_j  (query-parallel kernel),   dK_j = scale * sum_i dS_ij Q_i (key-parallel).
The key-parallel kernel loops over all query heads of its KV group, so dK/dV need no cross-invocation sum.
"""

from __future__ import annotations

from helios.kernels.attention.common import (
    KERNEL_VARIANTS,
    Stream,
    addressed,
    comp,
    declare,
    input_buffer,
    key_index,
    lane_reduce,
    load_rows,
    output_buffer,
    reg_loop,
    row_regs,
    rows,
    rows_per_group,
    tile_row,
    uniform_bounds,
    zero_regs,
)
from helios.kernels.attention.forward import attention_flops, capped, dropped, forward_grid, row_bounds
from helios.kernels.contract.dtypes import storage, variant_dtype, with_dtypes
from helios.spirv import Kernel, KernelBuilder, Variant, ceil_div, f32, u32

PRE_WG = 64


def build_preprocess(b: KernelBuilder, v: Variant) -> None:
    """delta[b, h, i] = dO_i . O_i. Bindings: 0 o [B, T, H D], 1 do (same; both the variant's dtype),
    2 delta [B, H, T] (w, f32)."""
    io = storage(variant_dtype(v.params))
    o, do, delta = b.buffer(0, io, "r"), b.buffer(1, io, "r"), b.buffer(2, f32, "w")
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


def fuses_delta(v: Variant) -> bool:
    """Whether the variant's dQ kernel computes Delta itself (and the preprocess kernel does not run): where one
    lane holds a whole dO row (tpr 1, the rowwise variants), it takes dO . O in the preprocess kernel's order and
    stores it for the dK/dV kernel, one dispatch fewer. Split rows ("tiled") keep the preprocess kernel."""
    return v.tpr == 1


def _bwd_decl(b: KernelBuilder, v: Variant, delta_mode: str = "r"):
    qkv, lse, do = input_buffer(b, v, 0), b.buffer(1, f32, "r", addressed(v)), input_buffer(b, v, 2)
    delta, dqkv = b.buffer(3, f32, delta_mode, addressed(v)), output_buffer(b, v, 4)
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
    """dQ, query-parallel: RQ rows per invocation stream K/V.
    Bindings: qkv, lse, do, delta (r; w where the variant `fuses_delta`), dqkv (w), 5 RNG counter, 6 o (r, read
    where it fuses Delta)."""
    fused = fuses_delta(v)
    qkv, lse, do, delta, dqkv = _bwd_decl(b, v, "w" if fused else "r")
    d = declare(b, counter_binding=5)
    rw = rows(b, v, d)
    T, RQ = d.T, v.rq
    S4 = (d.H + d.Hkv * 2) * d.D4
    tok0 = rw.batch * T
    q, dov, dq = (row_regs(b, v, d, n) for n in ("q", "do", "dq"))
    load_rows(b, v, d, qkv, [(tok0 + rc) * S4 + rw.head * d.D4 for rc in rw.rows_c], rw.lane, q, mul=d.scale)
    load_rows(b, v, d, do, _head_rows(d, tok0, rw), rw.lane, dov)
    zero_regs(b, v, d, dq)
    row_ids = [(rw.batch * d.H + rw.head) * T + rc for rc in rw.rows_c]
    lse_r = [lse[i] for i in row_ids]
    if fused:
        delta_r = _own_delta(b, v, d, input_buffer(b, v, 6), _head_rows(d, tok0, rw), dov)
        for r, row in enumerate(rw.rows):
            with b.if_(row < T):
                delta[row_ids[r]] = delta_r[r]
    else:
        delta_r = [delta[i] for i in row_ids]
    kbase = tok0 * S4 + (d.H + rw.head / d.group) * d.D4
    stream = Stream(b, v, d, qkv, [kbase, kbase + d.Hkv * d.D4], S4)
    drop_rows = [(rw.batch * d.H + rw.head) * T + row for row in rw.rows]

    def step(j0):
        js = [key_index(b, j0, u, T) for u in range(v.kb_bwd)]
        sp, dp = _score_dots(b, v, d, stream, js, rw.lane, q, dov)  # q . k_j, dO . v_j
        dss = []
        for r in range(RQ):
            row = []
            for u, (j, _) in enumerate(js):
                ok = (j < T) & (~d.causal | (j <= rw.rows[r]))
                _, ds = _prob_and_dscore(b, v, d, sp[r][u].value, dp[r][u].value, lse_r[r], delta_r[r], ok,
                                         drop_rows[r], j)
                row.append(ds)
            dss.append(row)
        with reg_loop(b, v, d) as t:
            # read again from the staged step (broadcast or shared memory): cheaper than register copies
            c, _ = comp(b, v, d, rw.lane, t)
            ks = [stream.at(0, tile_row(stream, j, jc), c) for j, jc in js]
            for r in range(RQ):
                a = dq[r][t]
                for ds, kv in zip(dss[r], ks, strict=True):
                    a = a + kv * ds
                dq[r][t] = a

    stream.run(b.const(0, u32), row_bounds(b, v, d, rw), step, T, v.kb_bwd)
    for r, row in enumerate(rw.rows):
        with b.if_(row < T):
            base = (tok0 + row) * S4 + rw.head * d.D4
            with reg_loop(b, v, d) as t:
                c, ok = comp(b, v, d, rw.lane, t)
                with b.if_(ok):
                    dqkv.vec4[base + c] = dq[r][t] * d.scale


def _head_rows(d, tok0, rw) -> list:
    """The vec4 index where each of the invocation's rows of its head starts in a [B, T, H * D] tensor (dO, O)."""
    return [(tok0 + rc) * (d.H * d.D4) + rw.head * d.D4 for rc in rw.rows_c]


def _own_delta(b: KernelBuilder, v: Variant, d, o, bases: list, dov) -> list:
    """Delta_r = dO_r . O_r of each of the lane's rows (whole rows: tpr 1), summed over c = 0..D4-1 from 0 as
    build_preprocess sums them, so the value (and every gradient after it) is the preprocess kernel's bit for bit."""
    acc = [b.var(f32, 0.0) for _ in bases]
    with reg_loop(b, v, d) as t:
        for r, base in enumerate(bases):
            acc[r] += b.dot(o.vec4[base + t], dov[r][t])
    return [a.value for a in acc]


def _score_dots(b: KernelBuilder, v: Variant, d, stream, idx, lane, left, right):
    """(sp, dp): sp[r][u] = left[r] . stream 0's row idx[u] and dp[r][u] = right[r] . stream 1's, summed over the
    head dim (this lane's part): the scores and dP of one streamed step, for dQ (q, dO vs K, V) and dK/dV
    (k, v vs Q, dO)."""
    sp = [[b.var(f32, 0.0) for _ in idx] for _ in range(v.rq)]
    dp = [[b.var(f32, 0.0) for _ in idx] for _ in range(v.rq)]
    with reg_loop(b, v, d) as t:
        c, _ = comp(b, v, d, lane, t)
        xs = [stream.at(0, tile_row(stream, i, ic), c) for i, ic in idx]
        ys = [stream.at(1, tile_row(stream, i, ic), c) for i, ic in idx]
        for r in range(v.rq):
            lt, rt = left[r][t], right[r][t]
            for u in range(v.kb_bwd):
                sp[r][u] += b.dot(lt, xs[u])
                dp[r][u] += b.dot(rt, ys[u])
    return sp, dp

def build_dkv(b: KernelBuilder, v: Variant) -> None:
    """dK/dV, key-parallel over KV heads: RQ key rows per invocation stream Q/dO of every query head of
    their group."""
    qkv, lse, do, delta, dqkv = _bwd_decl(b, v)
    d = declare(b, counter_binding=5)
    rw = rows(b, v, d)  # rw.head is the KV head here
    T, RQ = d.T, v.rq
    S4 = (d.H + d.Hkv * 2) * d.D4
    HD4 = d.H * d.D4
    tok0 = rw.batch * T
    k, vv, dk, dv = (row_regs(b, v, d, n) for n in ("k", "v", "dk", "dv"))
    kbases = [(tok0 + rc) * S4 + (d.H + rw.head) * d.D4 for rc in rw.rows_c]
    load_rows(b, v, d, qkv, kbases, rw.lane, k, mul=d.scale)
    load_rows(b, v, d, qkv, [kb + d.Hkv * d.D4 for kb in kbases], rw.lane, vv)
    zero_regs(b, v, d, dk, dv)
    # Causal: query rows before the first key row see none of these keys (uniform for "tiled").
    first = rw.block * rw.R if v.tiled else rw.first
    lo = uniform_bounds(b, v, b.select(d.causal, b.min(first, T), b.const(0, u32)), T)[0]
    with b.for_range(0, d.group) as hh:
        h = rw.head * d.group + hh
        stream = _QdoStream(b, v, d, qkv, do, tok0 * S4 + h * d.D4, tok0 * HD4 + h * d.D4, S4, HD4)
        row0 = (rw.batch * d.H + h) * T

        def step(i0):
            iis = [key_index(b, i0, u, T) for u in range(v.kb_bwd)]
            sp, dp = _score_dots(b, v, d, stream, iis, rw.lane, k, vv)  # k . q_i, v . dO_i
            stats = [(stream.row_scalar(lse, row0, i0, u, T), stream.row_scalar(delta, row0, i0, u, T))
                     for u in range(len(iis))]
            pzs, dss = [], []
            for r in range(RQ):
                pr, dr = [], []
                for u, (i, _) in enumerate(iis):
                    ok = (i < T) & (~d.causal | (i >= rw.rows[r]))
                    pz, ds = _prob_and_dscore(b, v, d, sp[r][u].value, dp[r][u].value, stats[u][0], stats[u][1],
                                              ok, row0 + i, rw.rows[r])
                    pr.append(pz)
                    dr.append(ds)
                pzs.append(pr)
                dss.append(dr)
            with reg_loop(b, v, d) as t:
                c, _ = comp(b, v, d, rw.lane, t)
                qs = [stream.at(0, tile_row(stream, i, ic), c) for i, ic in iis]
                dos = [stream.at(1, tile_row(stream, i, ic), c) for i, ic in iis]
                for r in range(RQ):
                    ak, av = dk[r][t], dv[r][t]
                    for u in range(v.kb_bwd):
                        ak = ak + qs[u] * dss[r][u]
                        av = av + dos[u] * pzs[r][u]
                    dk[r][t], dv[r][t] = ak, av

        stream.run(lo, T, step, T, v.kb_bwd)
    for r, row in enumerate(rw.rows):
        with b.if_(row < T):
            base = (tok0 + row) * S4 + (d.H + rw.head) * d.D4
            with reg_loop(b, v, d) as t:
                c, ok = comp(b, v, d, rw.lane, t)
                with b.if_(ok):
                    dqkv.vec4[base + c] = dk[r][t] * d.scale
                    dqkv.vec4[base + d.Hkv * d.D4 + c] = dv[r][t]


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


def pre_grid(shape: tuple[int, ...], variant: Variant) -> tuple[int, int, int]:
    """shape = (B, T, H, Hkv): a workgroup per PRE_WG query rows of a head."""
    B, T, H, _ = shape
    return (ceil_div(T, PRE_WG), H, B)


def dkv_grid(shape: tuple[int, ...], variant: Variant) -> tuple[int, int, int]:
    """shape = (B, T, H, Hkv): a workgroup per rows_per_group key rows of a KV head."""
    B, T, _, Hkv = shape
    return (ceil_div(T, rows_per_group(variant)), Hkv, B)


ATTENTION_BACKWARD_PRE = Kernel(
    "attention_backward_preprocess", build_preprocess, variants=with_dtypes({"vec4": {}}), grid=pre_grid,
    flops=lambda B, T, H, D: 2 * B * T * H * D, bytes=lambda B, T, H, D: 8 * B * T * H * D + 4 * B * H * T,
)
ATTENTION_BACKWARD_DQ = Kernel(
    "attention_backward_dq", build_dq, variants=KERNEL_VARIANTS, grid=forward_grid,  # query-parallel too
    flops=lambda B, T, H, D, causal=True: 1.5 * attention_flops(B, T, H, D, causal),
)
ATTENTION_BACKWARD_DKV = Kernel(
    "attention_backward_dkv", build_dkv, variants=KERNEL_VARIANTS, grid=dkv_grid,
    flops=lambda B, T, H, D, causal=True: 2.0 * attention_flops(B, T, H, D, causal),
)
