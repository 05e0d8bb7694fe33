"""Flash attention on the matrix units (cooperative matrices): the forward, and what its backward shares.

A workgroup of WG lanes (any subgroup size from 4 to 64: subgroups and lanes are read from the builtins) owns
16 query rows of one (batch, head). Per block of 16 keys it stages K and V in shared memory (16-bit patterns,
zeros past T), computes S = Q . K^T as one 16 x 16 tile over D/16 cooperative MulAdds, and stores S in a shared
f32 tile, since which lane holds which element of a cooperative matrix is opaque. 16 lanes then run the online
softmax on S's rows (scale, softcap, causal mask, dropout) and write P rounded to the io dtype; the running
output O (f32, shared) is rescaled by exp(m_old - m_new) lane by lane, and O += P . V runs on the matrix units
with O loaded and stored as accumulators. So no per-row scaling of an opaque accumulator is ever needed.

Same bindings, push constants and spec constants as the other attention kernels (attention_common.declare), so
the op functions only pick other kernels. bf16 and fp16 io, head dims that are multiples of 16 up to MAX_D; f32
accumulation. Each variant comes native ("coopmat") and lowered to plain SPIR-V ("coopmat_emulated",
helios/spirv/coopmat_emulated.py): separate names, so pipelines and caches never mix them.
Versus the f32 kernels, P (and the backward's dS) are rounded once to the io dtype before their product, as
FlashAttention does on tensor cores.
"""

from __future__ import annotations

from helios.kernels.attention.common import NEG, declare, spec_values
from helios.kernels.attention.forward import attention_flops, capped, dropped
from helios.kernels.contract.dtypes import dtype_variant, storage
from helios.kernels.lib import coopmat_support as support
from helios.kernels.lib.coopmat_support import TILE  # rows per block and the M = N = K of every matrix tile
from helios.spirv import Kernel, KernelBuilder, Variant, bf16, ceil_div, f16, f32, u16, u32
from helios.spirv.coopmat import coopmat
from helios.spirv.memory import bf16_bits

WG = 64  # lanes per workgroup: 1 to 16 subgroups; a multiple of every Vulkan subgroup size up to 64
MAX_D = 128  # head dims up to here (multiples of 16): the dK/dV kernel's shared tiles fill 32 KiB there
LDH = MAX_D + 8  # row stride (elements) of the staged 16-bit tiles: 16-byte aligned rows, fewer bank conflicts
LDF = MAX_D  # row stride of the shared f32 accumulators
LOWERINGS = {"coopmat": "native", "coopmat_emulated": "emulated"}  # base variant -> cooperative-matrix lowering
HALF = {"bf16": "bf16", "fp16": "f16"}  # io dtype -> the matrices' element type, as DeviceInfo names it
VARIANTS = {dtype_variant(base, dtype): {"dtype": dtype, "coopmat": lowering}
            for base, lowering in LOWERINGS.items() for dtype in HALF}


def runs(info, dtype: str, head_dim: int, emulated: bool) -> bool:
    """Whether this device can run the variant of dtype at head_dim, lowered natively or emulated."""
    if dtype not in HALF or head_dim % TILE or not TILE <= head_dim <= MAX_D:
        return False
    return support.runs(info, dtype, max(shared_bytes.values()), emulated)


def choose(info, head_dim: int, dtype: str, forced: str | None) -> str | None:
    """The base variant ("coopmat" or "coopmat_emulated") on a device whose (real or emulated) matrix units take
    dtype x dtype -> f32 16x16x16 tiles, or a forced one it can run; None where attention runs without them."""
    if forced is not None:
        return forced if forced in LOWERINGS and runs(info, dtype, head_dim, forced == "coopmat_emulated") else None
    emulated = bool(info.cooperative_matrix_emulated)
    if not info.cooperative_matrix or not runs(info, dtype, head_dim, emulated):
        return None
    return "coopmat_emulated" if emulated else "coopmat"


def spec(dtype: str, head_dim: int, causal: bool, softcap: float, dropout_p: float) -> dict:
    """The launch's specialization constants: those of every attention kernel (the tiled variant's values for
    the ones these kernels do not read, so a head dim keys one pipeline)."""
    return spec_values(dtype_variant("tiled", dtype), head_dim, causal, softcap, dropout_p)


class Tiles:
    """What every matrix-unit attention kernel shares: the lowering, the matrix types, 16-bit staging of rows
    into shared memory, and tile products with f32 accumulators in shared memory."""

    def __init__(self, b: KernelBuilder, v: Variant) -> None:
        b.coopmat_lowering(v.coopmat)
        b.local_size(WG)
        self.b, self.dtype = b, v.dtype
        elem = f16 if v.dtype == "fp16" else bf16
        # bf16 is staged as its bit patterns (the DSL's bf16 is a storage type that loads as f32)
        self.staged = f16 if v.dtype == "fp16" else u16
        self.A, self.B = coopmat(elem, TILE, TILE, "a"), coopmat(elem, TILE, TILE, "b")
        self.C = coopmat(f32, TILE, TILE, "acc")
        self.tid = b.local_index()
        self.zero = b.const(0.0, f16) if self.staged == f16 else b.cast(b.const(0, u32), u16)

    def raw(self, binding: int):
        """An io-dtype input buffer as its 16-bit elements (copied to shared memory as they are)."""
        return self.b.buffer(binding, storage(self.dtype), "r").view_as(self.staged)

    def half(self, x):
        """The f32 x rounded to the io dtype, as a staged element."""
        b = self.b
        return b.cast(x, f16) if self.staged == f16 else b.cast(bf16_bits(b, x), u16)

    def stage(self, dst, dst_off, src, base, row0, T, stride, D) -> None:
        """dst[dst_off + r * LDH + c] = src[base + (row0 + r) * stride + c] for r < 16, c < D; zeros for rows >= T."""
        b = self.b
        with b.for_range(self.tid, TILE * D, step=WG) as e:
            r, c = e / D, e % D
            row = row0 + r
            inside = row < T
            dst[dst_off + r * LDH + c] = b.select(inside, src[base + b.select(inside, row, 0) * stride + c], self.zero)

    def fill(self, dst, n: int, value: float = 0.0) -> None:
        """dst[e] = value for e < n (the workgroup's lanes in turn)."""
        with self.b.for_range(self.tid, n, step=WG) as e:
            dst[e] = value

    def product(self, out, out_ld, a, a_ld, bm, b_ld, b_layout: str, n_tiles, k_tiles, accumulate: bool,
                batch: int = 1, strides: tuple = (0, 0, 0), offsets: tuple = (0, 0, 0)) -> None:
        """out[16 x 16 n_tiles] (+)= a[16 x 16 k_tiles] @ B, B row-major in bm ("row") or B^T row-major ("col");
        `batch` such products at element offsets offsets + k * strides (out, a, bm). Tile t is computed by subgroup
        t % NumSubgroups; out is f32 shared memory, a and bm 16-bit shared tiles."""
        b = self.b
        so, sa, sb = strides
        oo, oa, ob = offsets
        with b.for_range(b.subgroup_id(), n_tiles * batch, step=b.num_subgroups()) as t:
            k, j = t / n_tiles, t % n_tiles
            o_at, a_at = oo + k * so + j * TILE, oa + k * sa
            b_at = ob + k * sb + j * TILE * (1 if b_layout == "row" else b_ld)
            acc = b.var(self.C, b.coopmat_load(self.C, out, o_at, out_ld) if accumulate
                        else b.coopmat_fill(self.C, 0.0))
            with b.for_range(0, k_tiles) as kk:
                am = b.coopmat_load(self.A, a, a_at + kk * TILE, a_ld)
                step = kk * TILE * (b_ld if b_layout == "row" else 1)
                acc.value = b.coopmat_muladd(am, b.coopmat_load(self.B, bm, b_at + step, b_ld, b_layout), acc.value)
            b.coopmat_store(out, o_at, acc.value, out_ld)


def build_forward(b: KernelBuilder, v: Variant) -> None:
    """Bindings as attention_forward: 0 qkv (r), 1 o (w), 2 lse (w, f32), 3 RNG counter."""
    k = Tiles(b, v)
    qkv, o, lse = k.raw(0), b.buffer(1, storage(v.dtype), "w"), b.buffer(2, f32, "w")
    d = declare(b, counter_binding=3)
    T, D = d.T, d.D4 * 4
    S = (d.H + d.Hkv * 2) * D  # elements per token of qkv
    q0, head, batch = b.workgroup_id(0) * TILE, b.workgroup_id(1), b.workgroup_id(2)
    tok0, kvh = batch * T * S, head / d.group
    q_s, k_s, v_s = (b.shared(k.staged, TILE * LDH, n) for n in ("q", "k", "v"))
    s_s, p_s = b.shared(f32, TILE * TILE, "s"), b.shared(k.staged, TILE * TILE, "p")
    o_s, alpha_s = b.shared(f32, TILE * LDF, "o"), b.shared(f32, TILE, "alpha")
    k.stage(q_s, 0, qkv, tok0 + head * D, q0, T, S, D)
    k.fill(o_s, TILE * LDF)
    tid = k.tid
    m, l_ = b.var(f32, NEG, "m"), b.var(f32, 0.0, "l")
    row = q0 + tid  # the query row of lanes tid < 16
    drop_row = (batch * d.H + head) * T + row
    hi = b.select(d.causal, b.min(T, q0 + TILE), T)  # keys past the block's last row are masked for all its rows
    b.barrier()
    with b.for_range(0, hi, step=TILE) as j0:
        k.stage(k_s, 0, qkv, tok0 + (d.H + kvh) * D, j0, T, S, D)
        k.stage(v_s, 0, qkv, tok0 + (d.H + d.Hkv + kvh) * D, j0, T, S, D)
        b.barrier()
        k.product(s_s, TILE, q_s, LDH, k_s, LDH, "col", 1, D / TILE, accumulate=False)
        b.barrier()
        with b.if_(tid < TILE):
            m_new = b.var(f32, m.value)
            with b.for_range(0, TILE) as c:  # pass 1: scaled, capped, masked scores and their max
                j = j0 + c
                s, _ = capped(b, d, s_s[tid * TILE + c] * d.scale)
                s = b.select((j < T) & (~d.causal | (j <= row)), s, NEG)
                s_s[tid * TILE + c] = s
                m_new.value = b.max(m_new.value, s)
            total = b.var(f32, 0.0)
            with b.for_range(0, TILE) as c:  # pass 2: probabilities (undropped in l, dropped in P)
                s = s_s[tid * TILE + c]
                p = b.select(s > NEG * 0.5, b.exp(s - m_new.value), 0.0)
                total += p
                p_s[tid * TILE + c] = k.half(dropped(b, d, p, drop_row, j0 + c))
            alpha = b.exp(m.value - m_new.value)
            l_.value = l_.value * alpha + total.value
            m.value = m_new.value
            alpha_s[tid] = alpha
        b.barrier()
        with b.for_range(tid, TILE * D, step=WG) as e:
            r, c = e / D, e % D
            o_s[r * LDF + c] = o_s[r * LDF + c] * alpha_s[r]
        b.barrier()
        k.product(o_s, LDF, p_s, TILE, v_s, LDH, "row", D / TILE, 1, accumulate=True)
        b.barrier()
    with b.if_(tid < TILE):
        with b.if_(row < T):
            lse[(batch * d.H + head) * T + row] = m.value + b.log(l_.value)
        alpha_s[tid] = 1.0 / l_.value
    b.barrier()
    with b.for_range(tid, TILE * D, step=WG) as e:
        r, c = e / D, e % D
        with b.if_(q0 + r < T):
            o[(batch * T + q0 + r) * (d.H * D) + head * D + c] = o_s[r * LDF + c] * alpha_s[r]


def block_grid(shape: tuple[int, ...], variant: Variant) -> tuple[int, int, int]:
    """shape = (B, T, H, Hkv): a workgroup per 16 query rows of a head."""
    B, T, H, _ = shape
    return (ceil_div(T, TILE), H, B)


def _shared_bytes() -> dict:
    """Shared memory per kernel (the check in `runs`): 16-bit tiles, f32 tiles and per-row statistics."""
    half_tile, f32_tile, small = TILE * LDH * 2, TILE * LDF * 4, TILE * TILE
    return {"forward": 3 * half_tile + small * 4 + small * 2 + f32_tile + TILE * 4,
            "dq": 4 * half_tile + 2 * small * 4 + small * 2 + f32_tile + 2 * TILE * 4,
            "dkv": 3 * half_tile + 2 * f32_tile + 2 * small * 4 + 2 * small * 2 + 2 * TILE * 4}


shared_bytes = _shared_bytes()

ATTENTION_FORWARD_COOPMAT = Kernel(
    "attention_forward_coopmat", build_forward, variants=VARIANTS, grid=block_grid, flops=attention_flops,
    bytes=lambda B, T, H, Hkv, D: 2 * B * T * D * (H + 2 * Hkv + H) + 4 * B * H * T,
)
