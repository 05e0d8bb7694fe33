"""The fused one-token decode kernels (helios.kernels.decode), derived from their op specs: each spec's forward at
its largest test shape (the default model's block at a full context, its LM head over a 4096-token vocab) against
its numpy reference. The variant is what the "decode_kernels" rule picks. Counted: each kernel's FLOPs and the
bytes of its weights, cache rows and row in and out (block.py, head.py). Token-level sampling speed against HF
generate is tools/bench_sample.py's.
"""

from __future__ import annotations

import argparse
import functools

import numpy as np

from helios.bench import catalogue

BENCH = catalogue.declare(__name__, families=("decode_kernels",), order=95)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=10, help="timed samples per figure (median reported)")


def records(rng: np.random.Generator, repeats: int) -> list[dict]:
    """One record per decode spec, at its largest test shape."""
    import helios.runtime as rt
    from helios.bench.harness import compare
    from helios.kernels.contract.spec import specs
    from helios.kernels.decode.common import kernel_variant

    out = []
    for spec in specs("decode_kernels"):
        # the largest shape, with every argument given (decode_block's case without x embeds its token)
        sample = max(spec.sample_inputs("f32", None, rng), key=lambda s: (int(np.prod(s.shape)), s.args[0] is not None))
        targs = [rt.from_numpy(a) for a in sample.args]
        out.append(compare(spec.name, kernel_variant(sample.args[0].shape[-1]), "x".join(map(str, sample.shape)),
                           functools.partial(spec.apply, spec.forward, targs, **sample.scalars),
                           functools.partial(spec.apply, spec.reference, sample.args, **sample.scalars), ref="numpy",
                           flops=spec.flops(sample.shape), nbytes=spec.bytes(sample.shape), repeats=repeats))
    return out


def run(args: argparse.Namespace) -> list[dict]:
    return records(np.random.default_rng(0), args.repeats)
