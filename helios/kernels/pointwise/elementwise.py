"""Elementwise arithmetic: add/sub/mul/div with row and column broadcasting, scale, neg, clone, masked_fill,
add_inplace; each a `map_kernel` of helios.kernels.lib.maps (which says how variants, dtypes and grids work).

The arithmetic ops are forward-only op specs (helios.kernels.contract.spec, at the bottom): tests, bench entries and
docs/OPS.md rows derive from them; their autograd Functions (autograd/ops/elementwise.py) broadcast and stay
hand-written.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from functools import partial

import numpy as np

from helios.kernels.contract.dtypes import check_float
from helios.kernels.contract.op_functions import declare_ops
from helios.kernels.contract.spec import (
    AWKWARD_SHAPES,
    BroadcastShape,
    OpSpec,
    broadcast_operand,
    normal_inputs,
    register,
)
from helios.kernels.contract.tolerance import Tolerance
from helios.kernels.lib.maps import binary_op, map_kernel, output, run_map, unary_op
from helios.runtime import Tensor, copy
from helios.spirv import Kernel, KernelBuilder, Value, f32, u32


# -- arithmetic --------------------------------------------------------------------------------------
def reference_binary(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """numpy reference of add/sub/mul/div (numpy broadcasting covers the row and column forms)."""
    return {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op](a, b)


ADD = map_kernel("add", lambda b, x, y, index: x + y, n_in=2, broadcast=True)
SUB = map_kernel("sub", lambda b, x, y, index: x - y, n_in=2, broadcast=True)
MUL = map_kernel("mul", lambda b, x, y, index: x * y, n_in=2, broadcast=True)
DIV = map_kernel("div", lambda b, x, y, index: x / y, n_in=2, broadcast=True)
SCALE = map_kernel("scale", lambda b, x, index, s: x * s, params=[("s", f32)])
NEG = map_kernel("neg", lambda b, x, index: -x, flops=1)


def _masked_fill_body(b: KernelBuilder, x: Value, mask: Value, index: Value, value: Value, bits: Value) -> Value:
    # The mask is read as raw 32-bit words: `bits` is 0x7fffffff for a float mask (so -0.0 counts as zero)
    # and 0xffffffff for an integer mask, so one kernel serves both.
    return b.select((mask & bits).ne(0), b.splat(value, x.count), x)


ADD_INPLACE = map_kernel("add_inplace", lambda b, a, x, index, alpha: a + x * alpha, n_in=2, params=[("alpha", f32)],
                         flops=2, inplace=True)
MASKED_FILL = map_kernel("masked_fill", _masked_fill_body, inputs=(f32, u32), params=[("value", f32), ("bits", u32)],
                         flops=0)


def add(a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
    """a + b; b has a's shape, is a row vector [N] (N = a.shape[-1]) or a column [..., 1]."""
    return binary_op(ADD, a, b, out)


def sub(a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
    """a - b, broadcasting b like `add`."""
    return binary_op(SUB, a, b, out)


def mul(a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
    """a * b, broadcasting b like `add`."""
    return binary_op(MUL, a, b, out)


def div(a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
    """a / b, broadcasting b like `add`."""
    return binary_op(DIV, a, b, out)


def scale(x: Tensor, s: float, out: Tensor | None = None) -> Tensor:
    """x * s for a Python scalar s."""
    return unary_op(SCALE, x, out, s=float(s))


def neg(x: Tensor, out: Tensor | None = None) -> Tensor:
    """-x."""
    return unary_op(NEG, x, out)


def clone(x: Tensor, out: Tensor | None = None) -> Tensor:
    """A copy of x (a buffer copy command, no kernel)."""
    y = output(x, out)
    copy(x, y)
    return y


def masked_fill(x: Tensor, mask: Tensor, value: float, out: Tensor | None = None) -> Tensor:
    """x with `value` where mask (same shape; float32, int32 or uint32) is nonzero."""
    check_float(x)
    if mask.numel != x.numel or mask.dtype.itemsize != 4:
        raise ValueError(f"mask {mask.shape} {mask.dtype} must match x {x.shape} with a 32-bit dtype")
    y = output(x, out)
    bits = 0x7FFFFFFF if mask.dtype == np.float32 else 0xFFFFFFFF
    run_map(MASKED_FILL, [x, mask, y], x.numel, float_operands=[x], value=float(value), bits=bits)
    return y


def add_inplace(a: Tensor, b: Tensor, alpha: float = 1.0) -> Tensor:
    """a += alpha * b in place (no allocation, no new tensor); returns a."""
    check_float(a, b)
    if a.numel != b.numel:
        raise ValueError(f"add_inplace: a {a.shape} and b {b.shape} differ in size")
    run_map(ADD_INPLACE, [a, b], a.numel, alpha=float(alpha))
    return a


def reference_masked_fill(x: np.ndarray, mask: np.ndarray, value: float) -> np.ndarray:
    return np.where(mask != 0, np.asarray(value, dtype=x.dtype), x)


# the helios.ops functions this file declares beside its op specs (clone is a copy command, no kernel to spec)
OPS = declare_ops(__name__, clone)


# -- op specs: forward-only (their autograd Functions, autograd/ops/elementwise.py, broadcast and stay hand-written)
# Binary ops also run with b a row and a column of rows of 4-wide lengths (the row_/col_ 4-wide variants) and of odd
# lengths (their scalar fallback), 3-D included.
BINARY_SHAPES = AWKWARD_SHAPES + tuple(BroadcastShape(shape, form) for shape in ((33, 12), (3, 5, 8), (7, 33),
                                                                                 (33, 513), (1, 4097))
                                       for form in ("row", "col"))
# One f32 rounding of the exact result, then one of the dtype (nothing more for f32); division too (OpFDiv is
# correctly rounded on lavapipe), with two more f32 roundings for drivers whose division is 2.5 ulp.
ONE_ROUNDING = {"y": Tolerance(rel=1)}
EXACT = {"y": Tolerance()}  # the result is an input or a given value, rounded to the dtype at most


def _binary_inputs(rng: np.random.Generator, shape, **_) -> tuple[np.ndarray, np.ndarray]:
    return normal_inputs(rng, shape), normal_inputs(rng, broadcast_operand(shape))


def _divisor_inputs(rng: np.random.Generator, shape, **_) -> tuple[np.ndarray, np.ndarray]:
    a, b = _binary_inputs(rng, shape)
    return a, (b + np.sign(b)).astype(np.float32)  # |b| >= 1: quotients stay in fp16's range


def _binary_spec(fn: Callable, kernel: Kernel, doc: str, inputs=_binary_inputs, tolerance=ONE_ROUNDING) -> OpSpec:
    name = fn.__name__
    return register(OpSpec(name, doc, __name__, (kernel,), fn, None, partial(reference_binary, name), None, inputs,
                           args=("a", "b"), saves=(), shapes=BINARY_SHAPES, tolerance=tolerance, autograd=False,
                           torch_op=getattr(operator, "truediv" if name == "div" else name)))  # torch's operators


_binary_spec(add, ADD, "a + b; b of a's shape, a row vector [N] or a column [..., 1].")
_binary_spec(sub, SUB, "a - b, broadcasting b like add.")
_binary_spec(mul, MUL, "a * b, broadcasting b like add.")
_binary_spec(div, DIV, "a / b, broadcasting b like add.", _divisor_inputs, {"y": Tolerance(rel=3)})
register(OpSpec("scale", "x * s for a Python scalar s.", __name__, (SCALE,), scale, None,
                lambda x, s: x * s, None, lambda rng, shape, **_: (normal_inputs(rng, shape),), saves=(),
                scalars={"s": (-2.5, 0.37, 1.0)}, tolerance={"y": Tolerance(rel=2)},
                autograd=False, torch_op=lambda x, s: x * s))  # s rounded to f32, then the product
register(OpSpec("neg", "-x.", __name__, (NEG,), neg, None, np.negative, None,
                lambda rng, shape, **_: (normal_inputs(rng, shape),), saves=(), tolerance=EXACT, autograd=False,
                torch_op=lambda x: -x))


def _mask_inputs(rng: np.random.Generator, shape, **_) -> tuple[np.ndarray, np.ndarray]:
    return normal_inputs(rng, shape), (rng.random(shape) < 0.4).astype(np.int32)


register(OpSpec("masked_fill", "x with value where mask (same shape; float32, int32 or uint32) is nonzero.", __name__,
                (MASKED_FILL,), masked_fill, None, reference_masked_fill, None, _mask_inputs, args=("x", "mask"),
                indices=("mask",), saves=(), scalars={"value": (-1e4, 0.0, 2.5)}, tolerance=EXACT, autograd=False,
                torch_op=lambda x, mask, value: x.masked_fill(mask != 0, value)))
register(OpSpec("add_inplace", "a += alpha * b in place; returns a.", __name__, (ADD_INPLACE,), add_inplace, None,
                lambda a, b, alpha: a + alpha * b, None, _binary_inputs, args=("a", "b"), saves=(),
                inplace={"y": "a"}, scalars={"alpha": (1.0, -0.5, 1e-3)},
                tolerance={"y": Tolerance(rel=2, abs=1)}, autograd=False))
# ^ alpha rounded to f32, x * alpha and the sum: roundings of alpha * b too, which a cancelling a can exceed
