"""Fused AdamW over a flat arena (one dispatch) and grad_norm (two dispatches) vs numpy doing the same work.

The numpy reference updates params, m and v in place with preallocated temporaries (clip, masked decay,
moments, bias-corrected step). Bytes counted: adamw 32 per element (params, m, v read and written, grads
and the decay mask read); grad_norm 4 per element.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from helios.bench.harness import compare

FULL = [1_330_000, 5_850_000, 16_000_001]
QUICK = [1_000_003]
GPU_EXTRA = [124_000_000]  # GPT-2 small; past lavapipe's 128 MiB binding limit
HP = {"lr": 3e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="one arena of ~1M elements only")
    parser.add_argument("--repeats", type=int, default=10, help="timed samples per figure (median reported)")


def numpy_adamw(p, g, m, v, mask, step: int, clip: float = 0.5):
    """A callable doing one masked, clipped AdamW step in place, like the kernel."""
    t1, t2 = np.empty_like(p), np.empty_like(p)
    bc1, bc2 = 1 - HP["beta1"] ** step, 1 - HP["beta2"] ** step

    def run():
        np.multiply(g, clip, out=t1)  # clipped gradient
        np.multiply(mask, -HP["lr"] * HP["weight_decay"], out=t2)
        np.add(t2, 1.0, out=t2)
        np.multiply(p, t2, out=p)  # masked decoupled weight decay
        np.multiply(m, HP["beta1"], out=m)
        np.multiply(t1, 1 - HP["beta1"], out=t2)
        np.add(m, t2, out=m)
        np.multiply(v, HP["beta2"], out=v)
        np.multiply(t1, t1, out=t1)
        np.multiply(t1, 1 - HP["beta2"], out=t1)
        np.add(v, t1, out=v)
        np.sqrt(v, out=t1)
        np.multiply(t1, 1 / math.sqrt(bc2), out=t1)
        np.add(t1, HP["eps"], out=t1)
        np.divide(m, t1, out=t2)
        np.multiply(t2, HP["lr"] / bc1, out=t2)
        np.subtract(p, t2, out=p)

    return run


def _records(n: int, rng: np.random.Generator, repeats: int) -> list[dict]:
    """adamw, grad_norm and grad_norm + adamw records for an arena of n elements."""
    import helios.runtime as rt
    from helios.kernels.adamw import ADAMW, adamw_step, grad_norm

    p, g = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    m, v = np.zeros(n, np.float32), np.zeros(n, np.float32)
    mask = (rng.random(n) < 0.8).astype(np.float32)
    tp, tg, tm, tv, tk = (rt.from_numpy(a) for a in (p, g, m, v, mask))

    def step_fn():
        adamw_step(tp, tg, tm, tv, tk, **HP, step=10)

    def norm_fn():
        grad_norm(tg, 1.0)

    def both_fn():
        norm, clip = grad_norm(tg, 1.0)
        adamw_step(tp, tg, tm, tv, tk, **HP, step=10, clip_coef=clip, norm=norm, skip_above=1e9)

    ref_step = numpy_adamw(p, g, m, v, mask, step=10)

    def ref_norm():
        return min(1.0, 1.0 / (math.sqrt(float(np.dot(g, g))) + 1e-6))

    def ref_both():
        ref_norm()
        ref_step()

    shape, variant = str(n), "vec4"
    return [
        compare("adamw", variant, shape, step_fn, ref_step, ref="numpy", flops=ADAMW.flops(n),
                nbytes=ADAMW.bytes(n), repeats=repeats),
        compare("grad_norm", variant, shape, norm_fn, ref_norm, ref="numpy", flops=2 * n, nbytes=4 * n,
                repeats=repeats),
        compare("grad_norm+adamw", variant, shape, both_fn, ref_both, ref="numpy", flops=ADAMW.flops(n) + 2 * n,
                nbytes=ADAMW.bytes(n) + 4 * n, repeats=repeats),
    ]


def run(args: argparse.Namespace) -> list[dict]:
    """Records for adamw, grad_norm and grad_norm + adamw (the optimizer step of a training loop)."""
    import helios.runtime as rt

    info = rt.get_runtime().info
    quick = args.quick
    sizes = QUICK if quick else FULL
    if not info.is_cpu and not quick:
        sizes = sizes + [n for n in GPU_EXTRA if 4 * n <= info.max_storage_buffer_range]
    rng = np.random.default_rng(0)
    records = []
    for n in sizes:
        records += _records(n, rng, args.repeats)
    return records
