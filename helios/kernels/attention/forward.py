"""Flash-attention forward kernel: o and the per-row log-sum-exp in one pass over K/V, no T x T scores.

Each query row keeps its scaled q, a running max m, a running sum l and an unnormalised output
accumulator; every KB keys it rescales by exp(m_old - m_new) (the online-softmax recurrence).
"""

from __future__ import annotations

from helios.kernels.attention import common
from helios.kernels.lib.rng import uniform
from helios.spirv import Kernel, KernelBuilder, Variant, ceil_div, f32, u32


def capped(b: KernelBuilder, d, s):
    """The softcapped score and its tanh (s when softcap is off; the compiler drops the dead branch)."""
    th = b.tanh(s / d.cap)
    return b.select(d.softcap, d.cap * th, s), th


def dropped(b: KernelBuilder, d, p, row, col):
    """p * keep / (1 - p_drop) when dropout is on, else p. The draw of score (row, col) uses the key
    position col as index and the global query row (batch * H + head) * T + query as stream."""
    keep = uniform(b, d.seed, d.offset, col, row) >= d.p_drop
    return b.select(d.dropout, b.select(keep, p * d.inv_keep, 0.0), p)


def row_bounds(b: KernelBuilder, v: Variant, d, rw):
    """Key range [0, hi) the invocation's query rows see. Causal: keys past the last row are masked for
    every row, so stop there (per subgroup for "rowwise", whose lanes share loads through broadcasts; per
    workgroup for "tiled", whose barriers need a uniform trip count)."""
    last = (rw.block + 1) * rw.R - 1 if v.tiled else rw.last
    hi = b.select(d.causal, b.min(d.T, last + 1), d.T)
    return common.uniform_bounds(b, v, hi, hi)[1]


def build_forward(b: KernelBuilder, v: Variant) -> None:
    """Bindings: 0 qkv [B, T, (H + 2Hkv) D] (r), 1 o [B, T, H D] (w), 2 lse [B, H, T] (w), 3 RNG counter.
    qkv and o have the variant's dtype; lse is f32."""
    qkv, o = common.input_buffer(b, v, 0), common.output_buffer(b, v, 1)
    lse = b.buffer(2, f32, "w", common.addressed(v))
    d = common.declare(b, counter_binding=3)
    rw = common.rows(b, v, d)
    T, RQ = d.T, v.rq
    S4 = (d.H + d.Hkv * 2) * d.D4  # vec4s per token of qkv
    tok0 = rw.batch * T
    q = common.row_regs(b, v, d, "q")
    acc = common.row_regs(b, v, d, "acc")
    common.load_rows(b, v, d, qkv, [(tok0 + rc) * S4 + rw.head * d.D4 for rc in rw.rows_c], rw.lane, q, mul=d.scale)
    common.zero_regs(b, v, d, acc)
    m = [b.var(f32, common.NEG, f"m{r}") for r in range(RQ)]
    l_ = [b.var(f32, 0.0, f"l{r}") for r in range(RQ)]
    kbase = tok0 * S4 + (d.H + rw.head / d.group) * d.D4
    stream = common.Stream(b, v, d, qkv, [kbase, kbase + d.Hkv * d.D4], S4)
    drop_rows = [(rw.batch * d.H + rw.head) * T + row for row in rw.rows]

    def step(j0):
        js = [common.key_index(b, j0, u, T) for u in range(v.kb)]
        parts = [[b.var(f32, 0.0) for _ in js] for _ in range(RQ)]
        with common.reg_loop(b, v, d) as t:
            c, _ = common.comp(b, v, d, rw.lane, t)
            ks = [stream.at(0, common.tile_row(stream, j, jc), c) for j, jc in js]
            for r in range(RQ):
                qt = q[r][t]
                for part, kv in zip(parts[r], ks, strict=True):
                    part += b.dot(qt, kv)
        alphas, probs = [], []
        for r in range(RQ):
            scores, valid = [], []
            for part, (j, _) in zip(parts[r], js, strict=True):
                s, _ = capped(b, d, common.lane_reduce(b, v, part.value))
                ok = (j < T) & (~d.causal | (j <= rw.rows[r]))
                valid.append(ok)
                scores.append(b.select(ok, s, common.NEG))
            m_old = m[r].value
            m_new = m_old
            for s in scores:
                m_new = b.max(m_new, s)
            alpha = b.exp(m_old - m_new)
            ps = [b.select(ok, b.exp(s - m_new), 0.0) for s, ok in zip(scores, valid, strict=True)]
            total = ps[0]
            for p in ps[1:]:
                total = total + p
            l_[r].value = l_[r].value * alpha + total
            m[r].value = m_new
            alphas.append(alpha)
            probs.append([dropped(b, d, p, drop_rows[r], j) for p, (j, _) in zip(ps, js, strict=True)])
        with common.reg_loop(b, v, d) as t:
            c, _ = common.comp(b, v, d, rw.lane, t)
            vs = [stream.at(1, common.tile_row(stream, j, jc), c) for j, jc in js]
            for r in range(RQ):
                a = acc[r][t] * alphas[r]
                for p, vv in zip(probs[r], vs, strict=True):
                    a = a + vv * p
                acc[r][t] = a

    stream.run(b.const(0, u32), row_bounds(b, v, d, rw), step, T)
    for r, row in enumerate(rw.rows):
        with b.if_(row < T):
            inv = 1.0 / l_[r].value
            obase = (tok0 + row) * (d.H * d.D4) + rw.head * d.D4
            with common.reg_loop(b, v, d) as t:
                c, ok = common.comp(b, v, d, rw.lane, t)
                with b.if_(ok):
                    o.vec4[obase + c] = acc[r][t] * inv
            with b.if_(rw.lane == 0):
                lse[(rw.batch * d.H + rw.head) * T + row] = m[r].value + b.log(l_[r].value)


def attention_flops(B: int, T: int, H: int, D: int, causal: bool = True) -> float:
    """Algorithmic forward FLOPs (QK^T and PV), halved for causal masking."""
    return 4.0 * B * H * T * T * D * (0.5 if causal else 1.0)


def forward_grid(shape: tuple[int, ...], variant: Variant) -> tuple[int, int, int]:
    """shape = (B, T, H, Hkv), every attention kernel's: a workgroup per rows_per_group query rows of a head."""
    B, T, H, _ = shape
    return (ceil_div(T, common.rows_per_group(variant)), H, B)


ATTENTION_FORWARD = Kernel(
    "attention_forward", build_forward, variants=common.KERNEL_VARIANTS, grid=forward_grid,
    flops=lambda B, T, H, Hkv, D: attention_flops(B, T, H, D),  # the sizes bytes takes (op spec: B, T, H, Hkv, D)
    bytes=lambda B, T, H, Hkv, D: 4 * B * T * D * (H + 2 * Hkv + H) + 4 * B * H * T,
    requires=(),
)
