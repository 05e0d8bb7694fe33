"""Flash-attention backward on the matrix units: the dQ and dK/dV kernels of attention_backward (FlashAttention-2's
two-kernel form, deterministic, no atomics; the Delta = rowsum(dO * O) preprocess is shared), with every product
on 16 x 16 cooperative-matrix tiles (attention_coopmat.Tiles).

dQ (16 query rows of a head per workgroup; per block of 16 keys): S = Q K^T and dP = dO V^T as one batch of two
tile products into shared f32, then lanes form dS = P (dP Z - Delta) [* (1 - tanh^2)] elementwise, rounded to
the io dtype, and dQ += dS K accumulates in shared f32.
dK/dV (16 key rows of a KV head; per query head of its group and block of 16 queries): S^T = K Q^T and
dP^T = V dO^T, then P^T Z and dS^T, then dV += (P Z)^T dO and dK += dS^T Q. Q and dO take turns in one staging
tile, so that at head dim 128 the kernel fits 32 KiB of shared memory.
"""

from __future__ import annotations

from helios.kernels.attention.common import declare
from helios.kernels.attention.coopmat import LDF, LDH, TILE, VARIANTS, WG, Tiles, block_grid
from helios.kernels.attention.forward import attention_flops, capped, dropped
from helios.kernels.contract.dtypes import storage
from helios.spirv import Kernel, KernelBuilder, Variant, ceil_div, f32


def _bindings(b: KernelBuilder, k: Tiles, v: Variant):
    """As attention_backward: 0 qkv, 1 lse (f32), 2 do, 3 delta (f32), 4 dqkv (w), 5 RNG counter."""
    qkv, lse, do = k.raw(0), b.buffer(1, f32, "r"), k.raw(2)
    delta, dqkv = b.buffer(3, f32, "r"), b.buffer(4, storage(v.dtype), "w")
    return qkv, lse, do, delta, dqkv, declare(b, counter_binding=5)


def _pz_and_ds(b, d, s_raw, dp, lse_i, delta_i, ok, drop_row, drop_col):
    """(P Z, dS) of one (query, key) pair from the raw score q . k and dP = dO . v (attention_backward's math)."""
    s, th = capped(b, d, s_raw * d.scale)
    p = b.select(ok, b.exp(s - lse_i), 0.0)
    z = dropped(b, d, b.const(1.0, f32), drop_row, drop_col)  # keep / (1 - p_drop), or 1 without dropout
    ds = p * (dp * z - delta_i)
    return p * z, b.select(d.softcap, ds * (1.0 - th * th), ds)


def _stats(b, k: Tiles, lse, delta, lse_s, delta_s, row_base, row0, T) -> None:
    """lse_s[r], delta_s[r] of rows row0 + r (zeros past T)."""
    with b.if_(k.tid < TILE):
        row = row0 + k.tid
        inside = row < T
        at = row_base + b.select(inside, row, 0)
        lse_s[k.tid] = b.select(inside, lse[at], 0.0)
        delta_s[k.tid] = b.select(inside, delta[at], 0.0)


def _block(b: KernelBuilder, v: Variant):
    """What both backward kernels start with: the tiles, the bindings, (T, D, qkv's row stride S, dO's row stride
    HD) and the workgroup's (first row of its 16, head, batch entry)."""
    k = Tiles(b, v)
    bindings = _bindings(b, k, v)
    d = bindings[-1]
    T, D = d.T, d.D4 * 4
    sizes = (T, D, (d.H + d.Hkv * 2) * D, d.H * D)
    return k, bindings, sizes, (b.workgroup_id(0) * TILE, b.workgroup_id(1), b.workgroup_id(2))

def build_dq(b: KernelBuilder, v: Variant) -> None:
    """dQ of 16 query rows of a head."""
    k, (qkv, lse, do, delta, dqkv, d), (T, D, S, HD), (q0, head, batch) = _block(b, v)
    kvh, row_base = head / d.group, (batch * d.H + head) * T
    qd_s, kv_s = b.shared(k.staged, 2 * TILE * LDH, "qdo"), b.shared(k.staged, 2 * TILE * LDH, "kv")  # [Q; dO], [K; V]
    sp_s, ds_s = b.shared(f32, 2 * TILE * TILE, "s_dp"), b.shared(k.staged, TILE * TILE, "ds")
    dq_s = b.shared(f32, TILE * LDF, "dq")
    lse_s, delta_s = b.shared(f32, TILE, "lse"), b.shared(f32, TILE, "delta")
    k.stage(qd_s, 0, qkv, batch * T * S + head * D, q0, T, S, D)
    k.stage(qd_s, TILE * LDH, do, batch * T * HD + head * D, q0, T, HD, D)
    _stats(b, k, lse, delta, lse_s, delta_s, row_base, q0, T)
    k.fill(dq_s, TILE * LDF)
    hi = b.select(d.causal, b.min(T, q0 + TILE), T)
    b.barrier()
    with b.for_range(0, hi, step=TILE) as j0:
        k.stage(kv_s, 0, qkv, batch * T * S + (d.H + kvh) * D, j0, T, S, D)
        k.stage(kv_s, TILE * LDH, qkv, batch * T * S + (d.H + d.Hkv + kvh) * D, j0, T, S, D)
        b.barrier()
        # S = Q K^T and dP = dO V^T: one batch of two products
        k.product(sp_s, TILE, qd_s, LDH, kv_s, LDH, "col", 1, D / TILE, accumulate=False, batch=2,
                  strides=(TILE * TILE, TILE * LDH, TILE * LDH))
        b.barrier()
        with b.for_range(k.tid, TILE * TILE, step=WG) as e:
            r, c = e / TILE, e % TILE
            row, j = q0 + r, j0 + c
            ok = (j < T) & (~d.causal | (j <= row))
            _, ds = _pz_and_ds(b, d, sp_s[e], sp_s[TILE * TILE + e], lse_s[r], delta_s[r], ok, row_base + row, j)
            ds_s[e] = k.half(ds)
        b.barrier()
        k.product(dq_s, LDF, ds_s, TILE, kv_s, LDH, "row", D / TILE, 1, accumulate=True)  # dQ += dS K
        b.barrier()
    with b.for_range(k.tid, TILE * D, step=WG) as e:
        r, c = e / D, e % D
        with b.if_(q0 + r < T):
            dqkv[(batch * T + q0 + r) * S + head * D + c] = dq_s[r * LDF + c] * d.scale


def build_dkv(b: KernelBuilder, v: Variant) -> None:
    """dK and dV of 16 key rows of a KV head, summed over the query heads of its group."""
    k, (qkv, lse, do, delta, dqkv, d), (T, D, S, HD), (k0, kvh, batch) = _block(b, v)
    kv_s, x_s = b.shared(k.staged, 2 * TILE * LDH, "kv"), b.shared(k.staged, TILE * LDH, "q_or_do")
    dkv_s = b.shared(f32, 2 * TILE * LDF, "dk_dv")  # [dK; dV]
    sp_s, pd_s = b.shared(f32, 2 * TILE * TILE, "st_dpt"), b.shared(k.staged, 2 * TILE * TILE, "dst_pt")
    lse_s, delta_s = b.shared(f32, TILE, "lse"), b.shared(f32, TILE, "delta")
    k.stage(kv_s, 0, qkv, batch * T * S + (d.H + kvh) * D, k0, T, S, D)
    k.stage(kv_s, TILE * LDH, qkv, batch * T * S + (d.H + d.Hkv + kvh) * D, k0, T, S, D)
    k.fill(dkv_s, 2 * TILE * LDF)
    lo = b.select(d.causal, b.min(k0, T), 0)  # causal: queries before the first key see none of these keys
    q_at, do_at = batch * T * S, batch * T * HD
    with b.for_range(0, d.group) as hh:
        h = kvh * d.group + hh
        row_base = (batch * d.H + h) * T
        with b.for_range(lo, T, step=TILE) as i0:
            # Q and dO take turns in x_s; each pair of products is one run-time loop of two (one MulAdd site each,
            # which keeps the emulated kernel's code and compile time down)
            with b.for_range(0, 2) as phase:  # S^T = K Q^T (Q staged), then dP^T = V dO^T (dO staged)
                b.barrier()  # the previous readers of x_s, lse_s and delta_s are done
                with b.if_(phase.eq(0)):
                    k.stage(x_s, 0, qkv, q_at + h * D, i0, T, S, D)
                    _stats(b, k, lse, delta, lse_s, delta_s, row_base, i0, T)
                with b.else_():
                    k.stage(x_s, 0, do, do_at + h * D, i0, T, HD, D)
                b.barrier()
                k.product(sp_s, TILE, kv_s, LDH, x_s, LDH, "col", 1, D / TILE, accumulate=False,
                          offsets=(phase * (TILE * TILE), phase * (TILE * LDH), 0))
            b.barrier()
            with b.for_range(k.tid, TILE * TILE, step=WG) as e:
                r, c = e / TILE, e % TILE  # key r, query c
                j, i = k0 + r, i0 + c
                ok = (i < T) & (~d.causal | (i >= j))
                pz, ds = _pz_and_ds(b, d, sp_s[e], sp_s[TILE * TILE + e], lse_s[c], delta_s[c], ok, row_base + i, j)
                pd_s[e], pd_s[TILE * TILE + e] = k.half(ds), k.half(pz)  # [dS^T; (P Z)^T]
            with b.for_range(0, 2) as phase:  # dV += (P Z)^T dO (dO still staged), then dK += dS^T Q
                b.barrier()
                with b.if_(phase.eq(1)):
                    k.stage(x_s, 0, qkv, q_at + h * D, i0, T, S, D)
                b.barrier()
                other = 1 - phase
                k.product(dkv_s, LDF, pd_s, TILE, x_s, LDH, "row", D / TILE, 1, accumulate=True,
                          offsets=(other * (TILE * LDF), other * (TILE * TILE), 0))
    b.barrier()
    with b.for_range(k.tid, TILE * D, step=WG) as e:
        r, c = e / D, e % D
        with b.if_(k0 + r < T):
            at = (batch * T + k0 + r) * S + (d.H + kvh) * D + c
            dqkv[at] = dkv_s[r * LDF + c] * d.scale
            dqkv[at + d.Hkv * D] = dkv_s[(TILE + r) * LDF + c]


def dkv_grid(shape: tuple[int, ...], variant: Variant) -> tuple[int, int, int]:
    """shape = (B, T, H, Hkv): a workgroup per 16 key rows of a KV head."""
    B, T, _, Hkv = shape
    return (ceil_div(T, TILE), Hkv, B)


ATTENTION_BACKWARD_DQ_COOPMAT = Kernel(
    "attention_backward_dq_coopmat", build_dq, variants=VARIANTS, grid=block_grid,
    flops=lambda B, T, H, D, causal=True: 1.5 * attention_flops(B, T, H, D, causal),
)
ATTENTION_BACKWARD_DKV_COOPMAT = Kernel(
    "attention_backward_dkv_coopmat", build_dkv, variants=VARIANTS, grid=dkv_grid,
    flops=lambda B, T, H, D, causal=True: 2.0 * attention_flops(B, T, H, D, causal),
)
