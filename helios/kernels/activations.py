"""Pointwise math and activations with their backward: exp, log, sqrt, relu, gelu (tanh approximation),
silu, clamp, softcap; each a `map_kernel` with "scalar" and "vec4" variants (see elementwise.py).

Backward ops take the saved forward input (or output, where that is cheaper: exp and sqrt) and dy, and
return dx, matching PyTorch's gradients (relu and clamp pass gradient where torch does: x > 0, and
lo <= x <= hi). `tanh` here is a Cephes-style tanhf used by gelu and softcap instead of GLSL Tanh, whose
lavapipe lowering, (e^x - e^-x) / (e^x + e^-x), loses relative accuracy near 0 and must be clamped for
large |x| on other drivers; other kernels (a fused matmul epilogue) can import `tanh` and `gelu_value`.
"""

from __future__ import annotations

import math

import numpy as np

from helios.kernels.elementwise import check_f32, map_kernel, output, run_map, unary_op
from helios.runtime import Tensor
from helios.spirv import KernelBuilder, Value, f32

GELU_K0 = math.sqrt(2.0 / math.pi)
GELU_K1 = 0.044715


# -- DSL helpers (usable from other kernels) ----------------------------------------------------------
def tanh(b: KernelBuilder, x: Value) -> Value:
    """tanh(x) to ~1 ulp-ish relative accuracy everywhere; no NaN for large |x| (exp overflow gives +-1)."""
    a = b.abs(x)
    z = x * x
    # |x| < 0.625: odd minimax polynomial (Cephes tanhf), accurate relative to x near 0.
    poly = (((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z + 1.33314422036e-1) * z
    small = (poly - 3.33332819422e-1) * z * x + x
    big = 1.0 - 2.0 / (b.exp(a * 2.0) + 1.0)
    big = b.select(x < 0.0, -big, big)
    return b.select(a < 0.625, small, big)


def sigmoid(b: KernelBuilder, x: Value) -> Value:
    """1 / (1 + e^-x); exp overflow for very negative x gives 0, not NaN."""
    return 1.0 / (b.exp(-x) + 1.0)


def gelu_value(b: KernelBuilder, x: Value) -> Value:
    """GELU, tanh approximation (torch approximate="tanh")."""
    t = tanh(b, (x * x * GELU_K1 + 1.0) * x * GELU_K0)
    return x * 0.5 * (t + 1.0)


def gelu_grad(b: KernelBuilder, x: Value) -> Value:
    """d gelu / dx for the tanh approximation."""
    # Beyond |x| = 10 tanh is exactly +-1 in f32 and the gradient exactly 1 or 0; clamping keeps x^2 * (1 - t^2)
    # from becoming inf * 0 = NaN for huge |x|.
    x = b.clamp(x, -10.0, 10.0)
    x2 = x * x
    t = tanh(b, (x2 * GELU_K1 + 1.0) * x * GELU_K0)
    du = (x2 * (3.0 * GELU_K1) + 1.0) * GELU_K0
    return (t + 1.0) * 0.5 + x * 0.5 * (1.0 - t * t) * du


def _clamp(b: KernelBuilder, x: Value, lo: Value, hi: Value) -> Value:
    # min(max(x, lo), hi) as torch defines it (hi wins when lo > hi); NaN passes through, unlike FClamp.
    t = b.select(x < lo, b.splat(lo, x.count), x)
    return b.select(t > hi, b.splat(hi, x.count), t)


# -- kernels --------------------------------------------------------------------------------------------
EXP = map_kernel("exp", lambda b, x, index: b.exp(x), flops=1)
LOG = map_kernel("log", lambda b, x, index: b.log(x), flops=1)
SQRT = map_kernel("sqrt", lambda b, x, index: b.sqrt(x), flops=1)
RELU = map_kernel("relu", lambda b, x, index: b.select(x > 0.0, x, 0.0), flops=1)
GELU = map_kernel("gelu", lambda b, x, index: gelu_value(b, x), flops=16)
SILU = map_kernel("silu", lambda b, x, index: x * sigmoid(b, x), flops=4)
CLAMP = map_kernel("clamp", lambda b, x, index, lo, hi: _clamp(b, x, lo, hi), params=[("lo", f32), ("hi", f32)],
                   flops=2)
SOFTCAP = map_kernel("softcap", lambda b, x, index, cap: tanh(b, x / cap) * cap, params=[("cap", f32)], flops=16)

def _relu_bwd(b, x, dy, index):
    return b.select(x > 0.0, dy, 0.0)


def _silu_bwd(b, x, dy, index):
    s = sigmoid(b, x)
    return dy * s * ((1.0 - s) * x + 1.0)


def _clamp_bwd(b, x, dy, index, lo, hi):
    inside = (x >= lo) & (x <= hi)
    return b.select(inside, dy, 0.0)


def _softcap_bwd(b, x, dy, index, cap):
    t = tanh(b, x / cap)
    return dy * (1.0 - t * t)


RELU_BWD = map_kernel("relu_backward", _relu_bwd, n_in=2, flops=1)
GELU_BWD = map_kernel("gelu_backward", lambda b, x, dy, index: dy * gelu_grad(b, x), n_in=2, flops=22)
SILU_BWD = map_kernel("silu_backward", _silu_bwd, n_in=2, flops=8)
EXP_BWD = map_kernel("exp_backward", lambda b, y, dy, index: dy * y, n_in=2)
LOG_BWD = map_kernel("log_backward", lambda b, x, dy, index: dy / x, n_in=2)
SQRT_BWD = map_kernel("sqrt_backward", lambda b, y, dy, index: dy / (y * 2.0), n_in=2, flops=2)
CLAMP_BWD = map_kernel("clamp_backward", _clamp_bwd, n_in=2, params=[("lo", f32), ("hi", f32)], flops=2)
SOFTCAP_BWD = map_kernel("softcap_backward", _softcap_bwd, n_in=2, params=[("cap", f32)], flops=18)


# -- op functions: forward and backward side by side ----------------------------------------------------
def _grad_op(kernel, x: Tensor, dy: Tensor, **params) -> Tensor:
    check_f32(x, dy)
    if x.numel != dy.numel:
        raise ValueError(f"{kernel.name}: x {x.shape} and dy {dy.shape} differ in size")
    dx = output(dy, None)
    run_map(kernel, [x, dy, dx], x.numel, **params)
    return dx


def _bounds(lo: float | None, hi: float | None) -> dict:
    return {"lo": -math.inf if lo is None else float(lo), "hi": math.inf if hi is None else float(hi)}


def exp(x: Tensor) -> Tensor:
    """e^x."""
    return unary_op(EXP, x)


def exp_backward(y: Tensor, dy: Tensor) -> Tensor:
    """dx = dy * y, from the forward output y = e^x."""
    return _grad_op(EXP_BWD, y, dy)


def log(x: Tensor) -> Tensor:
    """Natural logarithm."""
    return unary_op(LOG, x)


def log_backward(x: Tensor, dy: Tensor) -> Tensor:
    """dx = dy / x."""
    return _grad_op(LOG_BWD, x, dy)


def sqrt(x: Tensor) -> Tensor:
    """Square root."""
    return unary_op(SQRT, x)


def sqrt_backward(y: Tensor, dy: Tensor) -> Tensor:
    """dx = dy / (2 y), from the forward output y = sqrt(x)."""
    return _grad_op(SQRT_BWD, y, dy)


def relu(x: Tensor) -> Tensor:
    """max(x, 0)."""
    return unary_op(RELU, x)


def relu_backward(x: Tensor, dy: Tensor) -> Tensor:
    """dy where x > 0, else 0."""
    return _grad_op(RELU_BWD, x, dy)


def gelu(x: Tensor) -> Tensor:
    """GELU, tanh approximation (torch.nn.functional.gelu(approximate="tanh"))."""
    return unary_op(GELU, x)


def gelu_backward(x: Tensor, dy: Tensor) -> Tensor:
    """dy * gelu'(x) for the tanh approximation."""
    return _grad_op(GELU_BWD, x, dy)


def silu(x: Tensor) -> Tensor:
    """x * sigmoid(x)."""
    return unary_op(SILU, x)


def silu_backward(x: Tensor, dy: Tensor) -> Tensor:
    """dy * s * (1 + x (1 - s)), s = sigmoid(x)."""
    return _grad_op(SILU_BWD, x, dy)


def clamp(x: Tensor, lo: float | None = None, hi: float | None = None) -> Tensor:
    """min(max(x, lo), hi); a None bound is open. NaN stays NaN where the driver keeps NaNs (Vulkan lets it not)."""
    return unary_op(CLAMP, x, **_bounds(lo, hi))


def clamp_min(x: Tensor, lo: float) -> Tensor:
    """max(x, lo)."""
    return clamp(x, lo, None)


def clamp_backward(x: Tensor, dy: Tensor, lo: float | None = None, hi: float | None = None) -> Tensor:
    """dy where lo <= x <= hi (inclusive, as torch), else 0."""
    return _grad_op(CLAMP_BWD, x, dy, **_bounds(lo, hi))


def softcap(x: Tensor, cap: float) -> Tensor:
    """cap * tanh(x / cap)."""
    return unary_op(SOFTCAP, x, cap=float(cap))


def softcap_backward(x: Tensor, dy: Tensor, cap: float) -> Tensor:
    """dy * (1 - tanh(x / cap)^2)."""
    return _grad_op(SOFTCAP_BWD, x, dy, cap=float(cap))


# -- numpy references (float64-capable) ------------------------------------------------------------------
def reference_gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(GELU_K0 * (x + GELU_K1 * x**3)))


def reference_gelu_grad(x: np.ndarray) -> np.ndarray:
    t = np.tanh(GELU_K0 * (x + GELU_K1 * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K0 * (1.0 + 3.0 * GELU_K1 * x * x)


def reference_sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def reference_clamp(x: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
    y = x if lo is None else np.where(x < lo, lo, x)
    return y if hi is None else np.where(y > hi, hi, y)


REFERENCE = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "relu": lambda x: np.maximum(x, 0.0),
    "gelu": reference_gelu, "silu": lambda x: x * reference_sigmoid(x),
}

# d op / dx as a function of the saved tensor the backward op takes (x, or y for exp and sqrt).
REFERENCE_GRAD = {
    "exp": lambda y: y, "log": lambda x: 1.0 / x, "sqrt": lambda y: 0.5 / y, "relu": lambda x: (x > 0).astype(x.dtype),
    "gelu": reference_gelu_grad,
    "silu": lambda x: reference_sigmoid(x) * (1.0 + x * (1.0 - reference_sigmoid(x))),
}


def reference_softcap(x: np.ndarray, cap: float) -> np.ndarray:
    return cap * np.tanh(x / cap)
