"""The optimizer ops' specs (adamw_step: one dispatch; grad_norm: one per tensor plus one; loss_scale_update: one
invocation) timed from their declarations, and grad_norm + adamw_step as a training step runs them, vs numpy.

Each spec runs its first test case's scalars and inputs (helios.kernels.contract.spec) on an arena of n elements;
FLOPs and bytes are the spec's (adamw 28 bytes per element, 32 with the decay mask; grad_norm 4). numpy runs
preallocated in-place baselines doing the same work (clip, masked decay, moments, bias-corrected step; f32 dot
products) where written below, else the spec's float64 reference. loss_scale_update does not grow with the arena: it
runs once. """

from __future__ import annotations

import argparse
import functools
import math

import numpy as np

from helios.bench import catalogue
from helios.bench.harness import compare

BENCH = catalogue.declare(__name__, families=("adamw", "grad_norm", "loss_scale"), order=70)

FULL = [1_330_000, 5_850_000, 16_000_001]
QUICK = [1_000_003]
GPU_EXTRA = [124_000_000]  # GPT-2 small; past lavapipe's 128 MiB binding limit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="one arena of ~1M elements only")
    parser.add_argument("--repeats", type=int, default=10, help="timed samples per figure (median reported)")


def numpy_adamw(p, g, m, v, mask, *, lr, beta1, beta2, eps, weight_decay, step, clip: float, **_):
    """A callable doing one masked, clipped AdamW step in place, like the kernel."""
    t1, t2 = np.empty_like(p), np.empty_like(p)
    bc1, bc2 = 1 - beta1 ** step, 1 - beta2 ** step

    def run():
        np.multiply(g, clip, out=t1)  # clipped gradient
        np.multiply(mask, -lr * weight_decay, out=t2)
        np.add(t2, 1.0, out=t2)
        np.multiply(p, t2, out=p)  # masked decoupled weight decay
        np.multiply(m, beta1, out=m)
        np.multiply(t1, 1 - beta1, out=t2)
        np.add(m, t2, out=m)
        np.multiply(v, beta2, out=v)
        np.multiply(t1, t1, out=t1)
        np.multiply(t1, 1 - beta2, out=t1)
        np.add(v, t1, out=v)
        np.sqrt(v, out=t1)
        np.multiply(t1, 1 / math.sqrt(bc2), out=t1)
        np.add(t1, eps, out=t1)
        np.divide(m, t1, out=t2)
        np.multiply(t2, lr / bc1, out=t2)
        np.subtract(p, t2, out=p)

    return run


def numpy_grad_norm(grads, max_norm: float):
    """A callable computing the global norm and clip coefficient with float32 dot products."""
    return lambda: min(1.0, max_norm / (math.sqrt(sum(float(np.dot(a, a)) for a in grads)) + 1e-6))


def _spec_record(spec, n: int, rng: np.random.Generator, repeats: int) -> tuple[dict, list, dict]:
    """One spec's record on an arena of n elements (its first f32 sample: no working copy), with its device
    arguments and scalars."""
    import helios.runtime as rt
    from helios.kernels.contract import selection

    sample = next(spec.sample_inputs("f32", None, rng, shapes=((n,),)))
    host, scalars, keyword = list(sample.args), sample.scalars, sample.keyword
    args = [None if a is None else rt.from_numpy(a) for a in host]
    named = dict(zip(spec.args, host, strict=True))
    if spec.name == "adamw_step":
        ref = numpy_adamw(*host[:5], **scalars, clip=float(named["clip_coef"][0]))
    elif spec.name == "grad_norm":
        ref = numpy_grad_norm(host, **scalars)
    else:
        ref = functools.partial(spec.apply, spec.reference, host, keyword, **scalars)
    shape = (n,) if spec.sizes((n,)) else ()
    plan = selection.choose(spec.family, shape)
    record = compare(spec.name, getattr(plan, "variant", plan), str(n) if shape else "-",
                     functools.partial(spec.apply, spec.forward, args, keyword, **scalars), ref, ref="numpy",
                     flops=spec.flops((n,)), nbytes=spec.bytes((n,)), repeats=repeats)
    return record, args, scalars


def _records(n: int, rng: np.random.Generator, repeats: int) -> list[dict]:
    """adamw_step and grad_norm from their specs, then grad_norm + adamw_step, for an arena of n elements."""
    from helios.kernels.contract.spec import spec_of

    step, norm = spec_of("adamw_step"), spec_of("grad_norm")
    (step_record, step_args, hp), (norm_record, _, _) = (_spec_record(s, n, rng, repeats) for s in (step, norm))
    params, grads, m, v, mask, *_ = step_args
    host_grads = grads.numpy()
    ref_step = numpy_adamw(params.numpy(), host_grads, m.numpy(), v.numpy(), mask.numpy(), **hp, clip=0.5)
    ref_norm = numpy_grad_norm([host_grads], 1.0)

    def both_fn():
        norm_t, clip_t = norm.forward(grads, 1.0)
        step.forward(params, grads, m, v, mask, **hp, clip_coef=clip_t, norm=norm_t)

    def ref_both():
        ref_norm()
        ref_step()

    return [step_record, norm_record,
            compare("grad_norm+adamw_step", step_record["variant"], str(n), both_fn, ref_both, ref="numpy",
                    flops=step.flops((n,)) + norm.flops((n,)), nbytes=step.bytes((n,)) + norm.bytes((n,)),
                    repeats=repeats)]


def once_records(rng: np.random.Generator, repeats: int) -> list[dict]:
    """The specs of BENCH.families whose work does not grow with the arena (loss_scale_update), once."""
    from helios.kernels.contract.spec import specs

    return [_spec_record(s, 1, rng, repeats)[0] for f in BENCH.families for s in specs(f) if not s.sizes((1,))]


def run(args: argparse.Namespace) -> list[dict]:
    """Records for adamw_step, grad_norm and grad_norm + adamw_step (the optimizer step of a training loop) per
    arena size, then loss_scale_update."""
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
    return records + once_records(rng, args.repeats)
