"""Fused elementwise ops: swiglu (silu(gate) * up) and residual_dropout_add (x + dropout(y)), forward and
backward.

Fusing saves memory passes: swiglu reads gate and up once and writes y (three passes instead of five for
silu then mul); its backward writes both gradients from one read of gate, up and dy. residual_dropout_add
draws the dropout mask from the counter-based RNG (see dropout.py) and adds the residual in the same pass;
its backward is dropout_backward. Variants: the elementwise family's accesses, in every dtype. Both are op
specs (helios.kernels.contract.spec; residual_dropout_add's p, seed and offset are scalars, as dropout's): their tests,
autograd Functions, bench entries and docs/OPS.md rows derive from the `register(OpSpec(...))` calls at the bottom.
"""

from __future__ import annotations

import numpy as np

from helios.kernels.contract.dtypes import check_float
from helios.kernels.contract.spec import OpSpec, normal_inputs, register
from helios.kernels.contract.tolerance import Tolerance
from helios.kernels.lib.maps import map_kernel, output, run_map
from helios.kernels.lib.rng import counter_or_zero
from helios.kernels.pointwise.activations import reference_sigmoid, sigmoid
from helios.kernels.pointwise.dropout import (
    DROPOUT,
    DROPOUT_SCALARS,
    DROPOUT_SHAPES,
    RNG_PARAMS,
    check_p,
    dropout_backward,
    dropped,
    reference_dropout,
    rng_push,
)
from helios.kernels.pointwise.elementwise import add, clone
from helios.runtime import Tensor, empty


def _swiglu(b, gate, up, index):
    return gate * sigmoid(b, gate) * up


def _swiglu_bwd(b, gate, up, dy, index):
    s = sigmoid(b, gate)
    silu = gate * s
    dsilu = s * ((1.0 - s) * gate + 1.0)
    return dy * up * dsilu, dy * silu


SWIGLU = map_kernel("swiglu", _swiglu, n_in=2, flops=5)
SWIGLU_BWD = map_kernel("swiglu_backward", _swiglu_bwd, n_in=3, n_out=2, flops=10)
RESIDUAL_DROPOUT_ADD = map_kernel(
    "residual_dropout_add", lambda b, x, y, index, **k: x + dropped(b, y, index, **k), n_in=2, params=RNG_PARAMS,
    flops=21, counter="offset")


def _same(*ts: Tensor) -> None:
    check_float(*ts)
    if any(t.numel != ts[0].numel for t in ts):
        raise ValueError(f"shapes differ: {', '.join(str(t.shape) for t in ts)}")


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up."""
    _same(gate, up)
    y = output(gate, None)
    run_map(SWIGLU, [gate, up, y], gate.numel)
    return y


def swiglu_backward(gate: Tensor, up: Tensor, dy: Tensor) -> tuple[Tensor, Tensor]:
    """(dgate, dup) = (dy * up * silu'(gate), dy * silu(gate))."""
    _same(gate, up, dy)
    dgate, dup = empty(gate.shape, gate.dtype), empty(up.shape, up.dtype)
    run_map(SWIGLU_BWD, [gate, up, dy, dgate, dup], gate.numel)
    return dgate, dup


def residual_dropout_add(x: Tensor, y: Tensor, p: float, seed: int, offset: int,
                         counter: Tensor | None = None) -> Tensor:
    """x + dropout(y) in one pass (`counter` as in dropout)."""
    _same(x, y)
    p = check_p(p)
    if p == 0.0:
        return add(x, y.reshape(x.shape))
    if p == 1.0:
        return clone(x)
    out = output(x, None)
    run_map(RESIDUAL_DROPOUT_ADD, [x, y, out, counter_or_zero(counter)], x.numel, **rng_push(p, seed, offset))
    return out


def residual_dropout_add_backward(dout: Tensor, p: float, seed: int, offset: int,
                                  counter: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(dx, dy) = (dout itself, dropout_backward(dout))."""
    return dout, dropout_backward(dout, p, seed, offset, counter)


def reference_swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return gate * reference_sigmoid(gate) * up


def reference_swiglu_backward(gate: np.ndarray, up: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = reference_sigmoid(gate)
    return dy * up * s * (1.0 + gate * (1.0 - s)), dy * gate * s


# -- op specs: tests, autograd, bench and docs/OPS.md derive from them (helios.kernels.contract.spec) ---------------
def _two_normal(rng: np.random.Generator, shape, **_) -> tuple[np.ndarray, np.ndarray]:
    return normal_inputs(rng, shape), normal_inputs(rng, shape)


# Tolerances in f32 roundings: silu's (one exp, a division) times up, as the pointwise ops (160 relative, 16
# absolute); each gradient composes a few more products around the same sigmoid (320 and 160).
register(OpSpec("swiglu", "silu(gate) * up (the LLaMA MLP's gate).", __name__, (SWIGLU, SWIGLU_BWD), swiglu,
                swiglu_backward, reference_swiglu, reference_swiglu_backward, _two_normal, args=("gate", "up"),
                saves=("gate", "up"), torch_op=lambda gate, up: gate * gate.sigmoid() * up,
                tolerance={"y": Tolerance(rel=160, abs=16), "dgate": Tolerance(rel=320, abs=160),
                           "dup": Tolerance(rel=320, abs=160)}))


def reference_residual_dropout_add(x: np.ndarray, y: np.ndarray, p: float, seed: int, offset: int) -> np.ndarray:
    return x + reference_dropout(y, p, seed, offset)


def reference_residual_dropout_add_backward(dout: np.ndarray, p: float, seed: int, offset: int) -> tuple:
    return dout, reference_dropout(dout, p, seed, offset)


# The mask is exact (dropout's reference); y's scaled value is rounded to f32 before the add (one rounding of up to
# the row's scale when x cancels it), the sum once more, then to the dtype. dx is dout itself.
register(OpSpec("residual_dropout_add", "x + dropout(y) in one pass (the mask of dropout(y, p, seed, offset)).",
                __name__, (RESIDUAL_DROPOUT_ADD, DROPOUT), residual_dropout_add, residual_dropout_add_backward,
                reference_residual_dropout_add, reference_residual_dropout_add_backward, _two_normal, args=("x", "y"),
                outputs=("out",), saves=(), shapes=DROPOUT_SHAPES, scalars=DROPOUT_SCALARS,
                tolerance={"out": Tolerance(rel=1, abs=2, floor=1.0), "dx": Tolerance(), "dy": Tolerance(rel=1)}))
