"""An op's test cases as a generator, in the manner of PyTorch's OpInfo `sample_inputs`: `spec.sample_inputs(dtype,
choice, rng, kind)` yields `Sample`s (the tensor arguments, scalars, host-built backward keyword arguments, shape and
tolerances of one case), and the derived tests (tests/kernels/test_opspecs.py, the torch parity test) iterate them.

`default_samples` serves most ops from the spec's common fields (`shapes`, `scalars`, `inputs`, `tolerance`,
`optional`). An op with a special need declares its own generator beside it (`OpSpec(samples=...)`) built from the
pieces here (`scalar_shapes`, `draw`, `without_optional`): attention's sizes set by its shape, matmul's tilings that
run some shapes only, AdamW's keyword and half-only tensors, the embedding's sorted plan, exp's bounded half inputs.

Kinds of sample: "kernel" (the forward/backward test at the awkward shapes, the k-th shape with the k-th, cycling,
scalar case, then again without each optional argument), "gradcheck" (the finite-difference test: every scalar case
at a small shape) and "autograd" (the derived Function's test: the last scalar case at one shape).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from helios.kernels.contract.tolerance import Tolerance

KINDS = ("kernel", "gradcheck", "autograd")
SMALL_SHAPE = (3, 7)      # the default finite-difference shape
AUTOGRAD_SHAPE = (7, 33)  # the default autograd Function test's shape


@dataclass(frozen=True)
class Sample:
    """One test case of an op: one host array per spec arg (float32, int32 for index args; None where not given),
    its scalar keyword arguments, the args passed by keyword, backward's host-built keyword arguments and the
    tolerance of each output and gradient."""

    shape: tuple
    args: tuple
    scalars: Mapping[str, object]
    tolerance: Mapping[str, Tolerance]
    keyword: tuple[str, ...] = ()   # args forward and reference take by keyword, after the positional ones
    host_kwargs: Callable[[], Mapping] | None = field(default=None, compare=False)
    # ^ () -> keyword arguments only backward takes, built on the host when called (the embedding's sorted plan)
    label: str = ""                 # what sets this case apart ("without pos_table")

    def backward_kwargs(self) -> dict:
        """Backward's host-built keyword arguments (none for most ops)."""
        return dict(self.host_kwargs()) if self.host_kwargs else {}


def scalar_shapes(spec, kind: str, *, small: tuple = SMALL_SHAPE, autograd: tuple = AUTOGRAD_SHAPE,
                  shapes=None, keep: Callable | None = None) -> Iterator[tuple[int, tuple, dict]]:
    """(k, shape, scalars) of each case of `kind`: for "kernel" the k-th of `shapes` (the spec's by default) with the
    k-th scalar case (cycling: every scalar case at some shape, each shape once), those `keep` (shape -> bool)
    refuses left out; for "gradcheck" every scalar case at `small`; for "autograd" the last at `autograd`."""
    cases = spec.scalar_cases()
    if kind == "kernel":
        for k, shape in enumerate(spec.shapes if shapes is None else shapes):
            if keep is None or keep(shape):
                yield k, shape, cases[k % len(cases)]
    elif kind == "gradcheck":
        for k, case in enumerate(cases):
            yield k, small, case
    elif kind == "autograd":
        yield len(cases) - 1, autograd, cases[-1]
    else:
        raise ValueError(f"sample kind {kind!r}: expected one of {KINDS}")


def draw(spec, rng: np.random.Generator, shape, scalars: Mapping, **fields) -> Sample:
    """A sample of the spec's input generator at `shape` with `scalars` (tolerance: the spec's, unless given)."""
    fields.setdefault("tolerance", spec.tolerance)
    return Sample(shape, tuple(spec.inputs(rng, shape, **scalars)), dict(scalars), **fields)


def without_optional(spec, sample: Sample) -> Iterator[Sample]:
    """The sample, then again without each of the spec's optional args (the same arrays otherwise)."""
    yield sample
    for arg in spec.optional:
        args = tuple(None if n == arg else a for n, a in zip(spec.args, sample.args, strict=True))
        yield replace(sample, args=args, label=f"without {arg}")


def default_samples(spec, dtype: str, choice, rng: np.random.Generator, kind: str = "kernel", *, shapes=None,
                    keep: Callable | None = None) -> Iterator[Sample]:
    """The cases of most ops: the spec's input generator at each shape of `kind`, and for "kernel" each again
    without each optional argument."""
    for _, shape, scalars in scalar_shapes(spec, kind, shapes=shapes, keep=keep):
        sample = draw(spec, rng, shape, scalars)
        yield from (without_optional(spec, sample) if kind == "kernel" else (sample,))


def bounded_samples(bounds: Mapping[str, float]) -> Callable[..., Iterator[Sample]]:
    """The default samples with every float input clipped to +-bounds[dtype] in the kernel test of a dtype named
    there (where larger inputs would overflow that dtype's results: exp in fp16)."""

    def samples(spec, dtype, choice, rng, kind="kernel", **how) -> Iterator[Sample]:
        for sample in default_samples(spec, dtype, choice, rng, kind, **how):
            if kind == "kernel" and dtype in bounds:
                b = bounds[dtype]
                sample = replace(sample, args=tuple(a if a is None or n in spec.indices else np.clip(a, -b, b)
                                                    for n, a in zip(spec.args, sample.args, strict=True)))
            yield sample

    return samples
