"""One GPT-2 block for the one new row of a decode step, in one dispatch of one workgroup: `decode_block`.

For the row x at position t - 1 (t cached positions after it; x = wte[id] + wpe[t - 1] when no x is given: the
first block embeds its token itself): h = ln_1(x); qkv = h Wqkv^T + b, written into row
t - 1 of the layer's KV cache [block_size, 3C] (the layout autograd/nn/decode.py's cache keeps: q, k, v of every
head); per head, softmax(q k_j / sqrt(D)) over the cached rows j < t (f32) against their v; x += o Wproj^T + b;
x += gelu(ln_2(x) Wfc^T + b) Wout^T + b (gelu: the tanh form of the matmul epilogue, bias before it). The row, its
norm, q, the scores, the attention output and the hidden row live in shared memory (sized by specialization
constants); barriers separate the phases, one with storage-buffer semantics after the cache row is written, since
the attention phase reads it back. One workgroup: invocations share out each phase's outputs (vec4 units of rows;
(head, key) pairs for the scores; a subgroup per head for its softmax). The position and the token id are read from
a small int32 tensor `step` = (t, id), not pushed, so one captured token step serves every position (a replay
writes `step`). Inference only: no backward.
"""

from __future__ import annotations

import math

import numpy as np

from helios.kernels.contract.samples import draw, without_optional
from helios.kernels.contract.spec import OpSpec, register
from helios.kernels.contract.tolerance import Tolerance
from helios.kernels.decode.common import WG, each_unit, gemv4, kernel_variant, layernorm, vec4
from helios.kernels.lib.row_workers import FLT_MAX
from helios.kernels.lib.wide import WideView
from helios.kernels.pointwise.activations import gelu_value
from helios.kernels.rows.norms import reference_layernorm
from helios.runtime import Tensor, empty, launch
from helios.spirv import Kernel, KernelBuilder, Variant, f32, one_workgroup, u32

# Bindings after x (0) and the cache (1), in the op's argument order; y is the last.
PARAMS = ("ln1_w", "ln1_b", "w_qkv", "b_qkv", "w_proj", "b_proj", "ln2_w", "ln2_b", "w_fc", "b_fc", "w_out", "b_out")


# "plain" binds every tensor as a storage buffer; "addressed" reads and writes the cache and the four weight matrices
# through their device addresses, which lavapipe (Mesa 25) turns into gathers instead of bounds-checked loops over
# the lanes (helios.device.driver.gathers_pay_off), and unrolls 4 vec4s of each weight row per loop trip (a plain
# GEMV loop is left to the driver's compiler: unrolled, lavapipe's bounds-checked loads compile ~5x slower). The
# "decode_kernels" rule (select.py) picks one.
VARIANTS = {"plain": {"chunk": 1}, "addressed": {"addressed": True, "chunk": 4}}


# -- numpy reference ----------------------------------------------------------------------------------
def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def reference(x, cache, ln1_w, ln1_b, w_qkv, b_qkv, w_proj, b_proj, ln2_w, ln2_b, w_fc, b_fc, w_out, b_out, step, wte,
              wpe, *, n_head: int, eps: float = 1e-5):
    """(y [1, C], cache with row t - 1 set to the new row's qkv) for the row x [1, C] at position t - 1, step = (t,
    token id); x None: the token's embedding wte[id] + wpe[t - 1]."""
    t, token = int(step[0]), int(step[1])
    C = cache.shape[-1] // 3
    D = C // n_head
    x = (wte[token] + wpe[t - 1]).reshape(1, C) if x is None else x.reshape(1, C)
    qkv = reference_layernorm(x, ln1_w, ln1_b, eps)[0] @ w_qkv.T + b_qkv
    cache = cache.copy()
    cache[t - 1] = qkv[0]
    q, k, v = qkv[0, :C], cache[:t, C:2 * C], cache[:t, 2 * C:]
    o = np.empty(C, x.dtype)
    for h in range(n_head):
        s = k[:, h * D:(h + 1) * D] @ q[h * D:(h + 1) * D] / math.sqrt(D)
        p = np.exp(s - s.max())
        o[h * D:(h + 1) * D] = (p / p.sum()) @ v[:, h * D:(h + 1) * D]
    x = x + o @ w_proj.T + b_proj
    x = x + _gelu(reference_layernorm(x, ln2_w, ln2_b, eps)[0] @ w_fc.T + b_fc) @ w_out.T + b_out
    return x, cache


# -- kernel -------------------------------------------------------------------------------------------
def build(b: KernelBuilder, v: Variant) -> None:
    """Bindings: 0 x [C] (r), 1 cache [block_size, 3C] (rw), 2..13 PARAMS (r), 14 y [C] (w), 15 step (t, token id)
    (r), 16 wte [V, C], 17 wpe [block_size, C] (r; read where `embed` is pushed nonzero, else bound to anything)."""
    b.local_size(WG)
    C4, HID4, D4 = b.spec("C4", u32, 32), b.spec("HID4", u32, 128), b.spec("D4", u32, 8)
    SCORES, H = b.spec("SCORES", u32, 512), b.spec("H", u32, 4)
    # embed: a push constant, not a spec constant, so the first block shares the others' pipeline
    eps, scale, embed = b.push("eps", f32), b.push("scale", f32), b.push("embed", u32)
    addressed = v.get("addressed", False)  # the cache and weight matrices through device addresses, as u64 words

    def matrix(binding: int, access: str):
        buf = b.buffer(binding, f32, access, addressed)
        return WideView(b, buf) if addressed else buf.vec4

    x_in, kv = b.buffer(0, f32, "r"), matrix(1, "rw")
    p = {name: matrix(2 + k, "r") if name.startswith("w_") else b.buffer(2 + k, f32, "r").vec4
         for k, name in enumerate(PARAMS)}
    y = b.buffer(2 + len(PARAMS), f32, "w")
    step = b.buffer(15, u32, "r")
    wte, wpe = b.buffer(16, f32, "r").vec4, b.buffer(17, f32, "r").vec4
    t, token = b.clamp(step[0], 1, SCORES / H), step[1]  # t within 1..block_size: no write outside the cache
    xs, hs, q, att = (b.shared(vec4, C4, n) for n in ("xs", "hs", "q", "att"))
    hid, scores, partials = b.shared(vec4, HID4, "hid"), b.shared(f32, SCORES, "scores"), b.shared(f32, WG, "partials")
    lid = b.local_index()
    W4 = C4 * 3  # vec4s per cache row
    row = (t - 1) * W4

    def rows4(u):  # the weight rows of output vec4 u
        return [u * 4 + r for r in range(4)]

    def load(u):
        with b.if_(embed.ne(0)):
            xs[u] = wte[token * C4 + u] + wpe[(t - 1) * C4 + u]
        with b.else_():
            xs[u] = x_in.vec4[u]

    each_unit(b, lid, C4, load)
    b.barrier()
    layernorm(b, lid, C4, xs, hs, p["ln1_w"], p["ln1_b"], eps, partials)

    def project_qkv(u):
        out = p["b_qkv"][u] + gemv4(b, hs, p["w_qkv"], rows4(u), C4, v.chunk)
        kv[row + u] = out
        with b.if_(u < C4):
            q[u] = out

    each_unit(b, lid, W4, project_qkv)
    b.barrier(buffers=True)  # the attention phase reads the cache row just written

    def score(pair):
        h = pair / t
        j = pair - h * t
        acc = b.var(f32, 0.0)
        key = j * W4 + C4 + h * D4
        with b.for_range(0, D4, unroll=False) as d:
            acc.value = acc.value + b.dot(q[h * D4 + d], kv[key + d])
        scores[pair] = acc.value * scale  # scores[h * t + j]

    each_unit(b, lid, H * t, score)
    b.barrier()
    lane, lanes = b.subgroup_local_id(), b.subgroup_size()
    with b.for_range(b.subgroup_id(), H, b.num_subgroups()) as h:  # a subgroup per head: f32 softmax over t keys
        m = b.var(f32, -FLT_MAX)
        with b.for_range(lane, t, lanes, unroll=False) as j:
            m.value = b.max(m.value, scores[h * t + j])
        top = b.subgroup_max(m.value)
        s = b.var(f32, 0.0)
        with b.for_range(lane, t, lanes, unroll=False) as j:
            e = b.exp(scores[h * t + j] - top)
            scores[h * t + j] = e
            s.value = s.value + e
        inv = 1.0 / b.subgroup_add(s.value)
        with b.for_range(lane, t, lanes, unroll=False) as j:
            scores[h * t + j] = scores[h * t + j] * inv
    b.barrier()

    def attend(u):  # o's vec4 u of head u / D4: sum_j p_j v_j
        h = u / D4
        acc = b.var(vec4, 0.0)
        with b.for_range(0, t, unroll=False) as j:
            acc.value = acc.value + kv[j * W4 + C4 * 2 + u] * scores[h * t + j]
        att[u] = acc.value

    each_unit(b, lid, C4, attend)
    b.barrier()

    def project_out(u):  # xs[u] is read and written by this invocation alone
        xs[u] = xs[u] + p["b_proj"][u] + gemv4(b, att, p["w_proj"], rows4(u), C4, v.chunk)

    each_unit(b, lid, C4, project_out)
    b.barrier()
    layernorm(b, lid, C4, xs, hs, p["ln2_w"], p["ln2_b"], eps, partials)

    def fc(u):
        hid[u] = gelu_value(b, p["b_fc"][u] + gemv4(b, hs, p["w_fc"], rows4(u), C4, v.chunk))

    each_unit(b, lid, HID4, fc)
    b.barrier()

    def project_down(u):
        y.vec4[u] = xs[u] + p["b_out"][u] + gemv4(b, hid, p["w_out"], rows4(u), HID4, v.chunk)

    each_unit(b, lid, C4, project_down)


def block_flops(C: int, hidden: int, t: int) -> int:
    """Multiply-adds x 2 of the four projections and the attention over t keys (norms and softmax aside)."""
    return 2 * (3 * C * C + C * C + 2 * C * hidden) + 4 * t * C


DECODE_BLOCK = Kernel(
    "decode_block", build, variants=VARIANTS, grid=one_workgroup,
    flops=lambda T, t, C, H, hidden: block_flops(C, hidden, t),  # the sizes of a test shape (op spec)
    bytes=lambda T, t, C, H, hidden: 4 * (4 * C * C + 2 * C * hidden + 2 * t * C + 3 * C + 6 * C + 4 * C + hidden),
)


def spec_values(C: int, n_head: int, hidden: int, block_size: int) -> dict:
    """The specialization constants of a launch (they size the shared arrays, so they key the pipeline)."""
    return {"C4": C // 4, "HID4": hidden // 4, "D4": C // n_head // 4, "SCORES": n_head * block_size, "H": n_head}


# -- op function --------------------------------------------------------------------------------------
def decode_block(x: Tensor | None, cache: Tensor, ln1_w: Tensor, ln1_b: Tensor, w_qkv: Tensor, b_qkv: Tensor,
                 w_proj: Tensor, b_proj: Tensor, ln2_w: Tensor, ln2_b: Tensor, w_fc: Tensor, b_fc: Tensor,
                 w_out: Tensor, b_out: Tensor, step: Tensor, wte: Tensor, wpe: Tensor, *, n_head: int,
                 eps: float = 1e-5) -> tuple[Tensor, Tensor]:
    """(y [1, C], cache): a GPT-2 block on the row x [1, C] (None: wte[id] + wpe[t - 1]) at position t - 1, step an
    int32 tensor (t, token id) on the device, its qkv written into row t - 1 of cache [block_size, 3C] (returned,
    the same tensor), attending over rows 0..t-1; one dispatch, f32. t is the device's (not checked on the host): the
    kernel clamps it into 1..block_size, so it never writes outside the cache."""
    C = cache.shape[-1] // 3
    block_size, hidden = cache.shape[0], w_fc.shape[0]
    if C % 4 or C % n_head or (C // n_head) % 4 or hidden % 4 or tuple(cache.shape) != (block_size, 3 * C):
        raise ValueError(f"decode_block: n_embd {C}, n_head {n_head}, hidden {hidden}, cache {tuple(cache.shape)}: "
                         "needs n_embd, head_dim and hidden multiples of 4 and a cache [block_size, 3 * n_embd]")
    if x is not None and x.shape[-1] != C or wte.shape[-1] != C or tuple(wpe.shape) != (block_size, C):
        raise ValueError(f"decode_block: x {None if x is None else tuple(x.shape)}, wte {tuple(wte.shape)}, wpe "
                         f"{tuple(wpe.shape)} do not match n_embd {C} and block_size {block_size}")
    y = empty((1, C))
    params = (ln1_w, ln1_b, w_qkv, b_qkv, w_proj, b_proj, ln2_w, ln2_b, w_fc, b_fc, w_out, b_out)
    embed = x is None
    launch(DECODE_BLOCK, [wte if embed else x, cache, *params, y, step, wte, wpe],
           push={"eps": float(eps), "scale": 1.0 / math.sqrt(C // n_head), "embed": int(embed)}, grid=(1, 1, 1),
           spec=spec_values(C, n_head, hidden, block_size), variant=kernel_variant(C))
    return y, cache


# -- op spec: tests, bench and docs/OPS.md derive from it (helios.kernels.contract.spec) ----------------------------
# Test shapes (block_size, t, C, H, hidden): t = 1, 7, 33 and a full context; C 36 and 20 (not multiples of the
# workgroup, 3 and 5 heads), hidden off 4 * C. A pipeline is keyed by (C, H, hidden, block_size), so t = 7 and 33
# share one (the block's cold compile is ~1.5 s on lavapipe).
SHAPES = ((8, 1, 36, 3, 52), (40, 7, 20, 5, 80), (40, 33, 20, 5, 80), (128, 128, 128, 4, 512))


def _inputs(rng: np.random.Generator, shape, **_) -> tuple:
    """x and a filled cache unit normal; weights ~ N(0, 1/fan_in) so activations stay O(1); norms' w near 1; step
    (t, a token id), embedding tables of 11 tokens and block_size positions."""
    T, t, C, _, hidden = shape

    def w(n, k):
        return (rng.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)

    def vecs(n, mean=0.0):
        return (mean + 0.1 * rng.standard_normal(n)).astype(np.float32)

    x = rng.standard_normal((1, C)).astype(np.float32)
    cache = rng.standard_normal((T, 3 * C)).astype(np.float32)
    return (x, cache, vecs(C, 1.0), vecs(C), w(3 * C, C), vecs(3 * C), w(C, C), vecs(C), vecs(C, 1.0), vecs(C),
            w(hidden, C), vecs(hidden), w(C, hidden), vecs(C), np.array([t, rng.integers(11)], np.int32),
            rng.standard_normal((11, C)).astype(np.float32), rng.standard_normal((T, C)).astype(np.float32))


def _samples(spec, dtype, choice, rng, kind="kernel", **how):
    """Each shape (block_size, t, C, H, hidden) with its n_head, then again without x (the first block: it embeds
    its token itself)."""
    shapes = how.get("shapes") or spec.shapes
    keep = how.get("keep")
    for shape in shapes if kind == "kernel" else spec.shapes[:1]:
        if keep is None or keep(shape):
            sample = draw(spec, rng, shape, {"n_head": shape[3], "eps": 1e-5})
            yield from (without_optional(spec, sample) if kind == "kernel" else (sample,))


# y within 256 f32 roundings of max |y| (sums of a few hundred products, an exp and a tanh on the way); the cache row
# is one projection.
register(OpSpec(
    "decode_block", "A GPT-2 block on one new row at position t - 1 (step = (t, token id), int32 on the device; "
    "x None: the token's embedding wte[id] + wpe[t - 1]): its qkv written into the KV cache row, attention over rows "
    "0..t-1, MLP; one workgroup, inference only.", __name__, (DECODE_BLOCK,), decode_block, None,
    reference, None, _inputs, args=("x", "cache", *PARAMS, "step", "wte", "wpe"), outputs=("y", "cache"),
    family="decode_kernels", shapes=SHAPES, indices=("step",), optional={"x": None},
    sizes=lambda shape: (1,) * (5 - len(shape)) + tuple(shape),
    tolerance={"y": Tolerance(abs=256, floor=1.0), "cache": Tolerance(abs=64, floor=1.0)},
    autograd=False, inplace={"cache": "cache"}, samples=_samples, scalars={"n_head": (1,), "eps": (1e-5,)},
    fallback="the unfused decode ops"))
