"""The LM head of a decode step in one dispatch: `decode_head`, logits = ln_f(x) W^T for one row x [1, C] and a
row-major head weight W [V, C] (GPT-2's tied wte). Each workgroup normalises the row itself (C floats, cheaper than
a dispatch) and then computes ROWS logits, four vocab rows per invocation at a time. Inference only: no backward."""

from __future__ import annotations

import math

import numpy as np

from helios.kernels.contract.samples import draw
from helios.kernels.contract.spec import OpSpec, register
from helios.kernels.contract.tolerance import Tolerance
from helios.kernels.decode.block import VARIANTS
from helios.kernels.decode.common import WG, gemv4, kernel_variant, layernorm, vec4
from helios.kernels.lib.wide import WideView
from helios.kernels.rows.norms import reference_layernorm
from helios.runtime import Tensor, empty, launch
from helios.spirv import Kernel, KernelBuilder, Variant, ceil_div, f32, u32

ROWS = 16 * WG  # vocab rows per workgroup (4 per invocation at a time): 2 workgroups for a 4096-token vocab


def reference(x, w, b, head, *, eps: float = 1e-5):
    """logits [1, V] of layernorm(x [1, C]) @ head [V, C]^T."""
    return reference_layernorm(x.reshape(1, -1), w, b, eps)[0] @ head.T


def build(b: KernelBuilder, v: Variant) -> None:
    """Bindings: 0 x [C], 1 ln_f weight [C], 2 ln_f bias [C], 3 head [V, C] (r), 4 logits [V] (w)."""
    b.local_size(WG)
    C4 = b.spec("C4", u32, 32)
    V, eps = b.push("V", u32), b.push("eps", f32)
    x, w, bias = (b.buffer(k, f32, "r") for k in range(3))
    addressed = v.get("addressed", False)  # the head matrix through its device address, as u64 words
    head = b.buffer(3, f32, "r", addressed)
    matrix = WideView(b, head) if addressed else head.vec4
    logits = b.buffer(4, f32, "w")
    xs, hs, partials = b.shared(vec4, C4, "xs"), b.shared(vec4, C4, "hs"), b.shared(f32, WG, "partials")
    lid = b.local_index()
    with b.for_range(lid, C4, WG, unroll=False) as u:
        xs[u] = x.vec4[u]
    b.barrier()
    layernorm(b, lid, C4, xs, hs, w.vec4, bias.vec4, eps, partials)
    first = b.workgroup_id(0) * (ROWS // 4)  # in units of 4 vocab rows
    units = b.min(first + ROWS // 4, (V + 3) // 4)
    with b.for_range(first + lid, units, WG, unroll=False) as u:
        rows = [b.min(u * 4 + r, V - 1) for r in range(4)]  # a last unit past V reads row V - 1 again
        out = gemv4(b, hs, matrix, rows, C4, v.chunk)
        for r in range(4):
            with b.if_(u * 4 + r < V):
                logits[u * 4 + r] = out[r]


DECODE_HEAD = Kernel(
    "decode_head", build, variants=VARIANTS,
    grid=lambda shape, variant: (ceil_div(shape[1], ROWS), 1, 1),  # shape = (C, V)
    flops=lambda C, V: 2 * C * V + 8 * C * ceil_div(V, ROWS), bytes=lambda C, V: 4 * (C * V + V + 3 * C),
)


def decode_head(x: Tensor, w: Tensor, b: Tensor, head: Tensor, *, eps: float = 1e-5) -> Tensor:
    """logits [1, V] = layernorm(x [1, C]; w, b) @ head [V, C]^T, one dispatch, f32."""
    C, V = x.shape[-1], head.shape[0]
    if C % 4 or head.shape[-1] != C:
        raise ValueError(f"decode_head: x has {C} columns and head {tuple(head.shape)}: needs head [V, C], C a "
                         "multiple of 4")
    logits, variant = empty((1, V)), kernel_variant(C)
    launch(DECODE_HEAD, [x, w, b, head, logits], push={"V": V, "eps": float(eps)},
           grid=DECODE_HEAD.grid_for((C, V), variant), spec={"C4": C // 4}, variant=variant)
    return logits


# -- op spec -------------------------------------------------------------------------------------------
SHAPES = ((36, 1), (20, 7), (64, 513), (128, 4096))  # (C, V): vocab 1, 7, one past a workgroup's rows, the default


def _inputs(rng: np.random.Generator, shape, **_) -> tuple:
    C, V = shape
    return (rng.standard_normal((1, C)).astype(np.float32), (1.0 + 0.1 * rng.standard_normal(C)).astype(np.float32),
            (0.1 * rng.standard_normal(C)).astype(np.float32),
            (rng.standard_normal((V, C)) / math.sqrt(C)).astype(np.float32))


def _samples(spec, dtype, choice, rng, kind="kernel", **how):
    shapes = how.get("shapes") or spec.shapes
    keep = how.get("keep")
    for shape in shapes if kind == "kernel" else spec.shapes[:1]:
        if keep is None or keep(shape):
            yield draw(spec, rng, shape, {"eps": 1e-5})


# Logits within 64 f32 roundings of max |logit| (a norm, then a C-long dot).
register(OpSpec(
    "decode_head", "The LM head of a decode step: logits [1, V] = layernorm(x [1, C]) @ head [V, C]^T; one dispatch, "
    "inference only.", __name__, (DECODE_HEAD,), decode_head, None, reference, None, _inputs,
    args=("x", "w", "b", "head"), family="decode_kernels", shapes=SHAPES,
    sizes=lambda shape: (1,) * (2 - len(shape)) + tuple(shape),
    tolerance={"y": Tolerance(abs=64, floor=1.0)}, autograd=False, samples=_samples, scalars={"eps": (1e-5,)},
    fallback="the unfused decode ops"))
