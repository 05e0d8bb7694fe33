"""Binary pointwise ops with their backward, one declaration each: maximum and minimum (torch.maximum and
torch.minimum). `binary_pointwise(...)` makes the forward kernel (a, b -> y) and the backward kernel
(a, b, dy -> da, db), both `map_kernel`s with "scalar" and "vec4" variants in every dtype, the op functions, and
registers the OpSpec that the tests, autograd, bench and docs/OPS.md derive from. Both operands have one shape: a
broadcast operand's gradient would need a reduction, which the hand-written add/sub/mul/div Functions do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from helios.kernels.contract.dtypes import check_float
from helios.kernels.contract.spec import OpSpec, normal_inputs, register
from helios.kernels.contract.tolerance import Tolerance
from helios.kernels.lib.maps import map_kernel, output, run_map
from helios.runtime import Tensor, empty
from helios.spirv import KernelBuilder, Value


class BinaryPointwise(NamedTuple):
    """What `binary_pointwise(...)` makes, for the declaring module to bind:
    `maximum, maximum_backward = binary_pointwise("maximum", ...)`. Its kernels are `spec_of(name).kernels`."""

    forward: Callable  # helios.ops.<name>(a, b) -> y
    backward: Callable  # helios.ops.<name>_backward(a, b, dy) -> (da, db)


def _same(op: str, *ts: Tensor) -> None:
    check_float(*ts)
    if any(t.numel != ts[0].numel for t in ts):
        raise ValueError(f"{op}: the operands' shapes differ: {', '.join(str(t.shape) for t in ts)} "
                         "(a binary pointwise op with a gradient takes one shape; broadcast first)")


def _two_normal(rng: np.random.Generator, shape, **_) -> tuple[np.ndarray, np.ndarray]:
    return normal_inputs(rng, shape), normal_inputs(rng, shape)


def binary_pointwise(name: str, doc: str, body, grad_body, reference, reference_grads, *, flops: int = 1,
                     grad_flops: int = 2, inputs=None, tolerance=None, torch_op=None,
                     module: str = __name__) -> BinaryPointwise:
    """Declare a binary pointwise op and its VJP: `body(b, a, c)` -> y, `grad_body(b, a, c, dy)` -> (da, db), with
    `reference(a, c)` and `reference_grads(a, c)` -> (dy/da, dy/db) in numpy (float64). Registers the OpSpec
    (args a, b; both saved) and returns the op functions, which the declaring module binds under `name` and
    `name_backward` (`module`: its __name__). `tolerance`: per y, da, db (default: exact up to the dtype's
    rounding); `torch_op`: the PyTorch equivalent the derived parity test compares against."""
    fwd_kernel = map_kernel(name, lambda b, a, c, index: body(b, a, c), n_in=2, flops=flops)
    bwd_kernel = map_kernel(f"{name}_backward", lambda b, a, c, dy, index: grad_body(b, a, c, dy), n_in=3, n_out=2,
                            flops=grad_flops)

    def forward(a: Tensor, b: Tensor) -> Tensor:
        _same(name, a, b)
        y = output(a, None)
        run_map(fwd_kernel, [a, b, y], a.numel)
        return y

    def backward(a: Tensor, b: Tensor, dy: Tensor) -> tuple[Tensor, Tensor]:
        _same(f"{name}_backward", a, b, dy)
        da, db = empty(a.shape, a.dtype), empty(b.shape, b.dtype)
        run_map(bwd_kernel, [a, b, dy, da, db], a.numel)
        return da, db

    def reference_backward(a: np.ndarray, b: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ga, gb = reference_grads(a, b)
        return dy * ga, dy * gb

    forward.__name__, backward.__name__ = name, f"{name}_backward"
    forward.__doc__, backward.__doc__ = doc, f"(da, db) for {name}, from the saved a, b and dy."
    forward.__module__ = backward.__module__ = module
    register(OpSpec(name, doc, module, (fwd_kernel, bwd_kernel), forward, backward, reference, reference_backward,
                    inputs or _two_normal, args=("a", "b"), saves=("a", "b"), torch_op=torch_op,
                    tolerance=tolerance or {"y": Tolerance(), "da": Tolerance(), "db": Tolerance()}))
    return BinaryPointwise(forward, backward)


# -- maximum and minimum: NaN propagates (torch's rule); a tie splits the gradient in halves, as torch does ------
def _pick(b: KernelBuilder, a: Value, c: Value, first_wins: Value) -> Value:
    chosen = b.select(first_wins, a, c)
    return b.select(a != a, a, b.select(c != c, c, chosen))  # NaN in either operand gives NaN


def _split(b: KernelBuilder, dy: Value, wins: Value, tie: Value) -> Value:
    return b.select(tie, dy * 0.5, b.select(wins, dy, 0.0))


def _reference_split(first_wins: np.ndarray, tie: np.ndarray) -> np.ndarray:
    return np.where(tie, 0.5, np.where(first_wins, 1.0, 0.0))


def _tie_inputs(rng: np.random.Generator, shape, **_) -> tuple[np.ndarray, np.ndarray]:
    """Normal operands with a quarter of b equal to a, so the tests see the tie rule."""
    a, b = _two_normal(rng, shape)
    return a, np.where(rng.random(shape) < 0.25, a, b).astype(np.float32)


maximum, maximum_backward = binary_pointwise(
    "maximum", "The larger of a and b elementwise, as torch.maximum (NaN if either is; a tie splits the gradient).",
    lambda b, a, c: _pick(b, a, c, a > c),
    lambda b, a, c, dy: (_split(b, dy, a > c, a == c), _split(b, dy, c > a, a == c)),
    lambda a, c: np.maximum(a, c),
    lambda a, c: (_reference_split(a > c, a == c), _reference_split(c > a, a == c)),
    inputs=_tie_inputs, grad_flops=4, torch_op=lambda a, c: a.maximum(c))
minimum, minimum_backward = binary_pointwise(
    "minimum", "The smaller of a and b elementwise, as torch.minimum (NaN if either is; a tie splits the gradient).",
    lambda b, a, c: _pick(b, a, c, a < c),
    lambda b, a, c, dy: (_split(b, dy, a < c, a == c), _split(b, dy, c < a, a == c)),
    lambda a, c: np.minimum(a, c),
    lambda a, c: (_reference_split(a < c, a == c), _reference_split(c < a, a == c)),
    inputs=_tie_inputs, grad_flops=4, torch_op=lambda a, c: a.minimum(c))
