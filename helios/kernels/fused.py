"""Fused elementwise ops: swiglu (silu(gate) * up) and residual_dropout_add (x + dropout(y)), forward and
backward.

Fusing saves memory passes: swiglu reads gate and up once and writes y (three passes instead of five for
silu then mul); its backward writes both gradients from one read of gate, up and dy. residual_dropout_add
draws the dropout mask from the counter-based RNG (see dropout.py) and adds the residual in the same pass;
its backward is dropout_backward. Variants "scalar" and "vec4".
"""

from __future__ import annotations

import numpy as np

from helios.kernels.activations import reference_sigmoid, sigmoid
from helios.kernels.dropout import RNG_PARAMS, check_p, dropout_backward, dropped, rng_push
from helios.kernels.elementwise import add, check_float, clone, map_kernel, output, run_map
from helios.kernels.rng import counter_or_zero
from helios.ops import declare_ops
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
                                  counter: Tensor | None = None) -> Tensor:
    """dy = dropout_backward(dout); dx is dout itself."""
    return dropout_backward(dout, p, seed, offset, counter)


def reference_swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return gate * reference_sigmoid(gate) * up


def reference_swiglu_backward(gate: np.ndarray, up: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = reference_sigmoid(gate)
    return dy * up * s * (1.0 + gate * (1.0 - s)), dy * gate * s


# the helios.ops names this file declares (helios/ops.py finds them here)
OPS = declare_ops(__name__, swiglu, swiglu_backward, residual_dropout_add, residual_dropout_add_backward)
