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
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from helios.kernels.contract.dtypes import check_float
from helios.kernels.contract.samples import bounded_samples
from helios.kernels.contract.spec import OpSpec, normal_inputs, register, spec_of
from helios.kernels.contract.tolerance import POINTWISE_TOLERANCE, Tolerance
from helios.kernels.lib.maps import map_kernel, output, run_map, unary_op
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


def _relu_bwd(b, x, dy):
    return b.select(x > 0.0, dy, 0.0)


def _silu_bwd(b, x, dy):
    s = sigmoid(b, x)
    return dy * s * ((1.0 - s) * x + 1.0)


def _clamp_bwd(b, x, dy, lo, hi):
    inside = (x >= lo) & (x <= hi)  # inclusive, as torch; NaN is outside
    return b.select(inside, dy, 0.0)


def _softcap_bwd(b, x, dy, cap):
    t = tanh(b, x / cap)
    return dy * (1.0 - t * t)


def _grad_op(kernel, x: Tensor, dy: Tensor, **params) -> Tensor:
    check_float(x, dy)
    if x.numel != dy.numel:
        raise ValueError(f"{kernel.name}: x {x.shape} and dy {dy.shape} differ in size")
    dx = output(dy, None)
    run_map(kernel, [x, dy, dx], x.numel, **params)
    return dx


def _bounds(lo: float | None, hi: float | None) -> dict:
    """clamp's push constants: a None bound is open (-inf or +inf)."""
    return {"lo": -math.inf if lo is None else float(lo), "hi": math.inf if hi is None else float(hi)}


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


def reference_clamp_grad(x: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
    inside = (x >= (-np.inf if lo is None else lo)) & (x <= (np.inf if hi is None else hi))
    return inside.astype(np.float64)


def reference_softcap(x: np.ndarray, cap: float) -> np.ndarray:
    return cap * np.tanh(x / cap)


def reference_softcap_grad(x: np.ndarray, cap: float) -> np.ndarray:
    return 1.0 - np.tanh(x / cap) ** 2


# -- pointwise op specs: one declaration each gives kernels, op functions, references, tests, autograd, docs ---
class Pointwise(NamedTuple):
    """What `pointwise(...)` makes, for the declaring module to bind: `gelu, gelu_backward = pointwise("gelu", ...)`.
    Its two kernels (NAME and NAME_backward) are `spec_of(name).kernels`."""

    forward: Callable  # helios.ops.<name>(x, *scalars)
    backward: Callable  # helios.ops.<name>_backward(saved, dy, *scalars)


def pointwise(name: str, doc: str, body, grad_body, reference, reference_grad, *, saves: str = "x", flops: int = 1,
              grad_flops: int = 1, grad_doc: str = "", inputs=None, scalars: dict | None = None,
              defaults: dict | None = None, push=None, tolerance=None, input_bound=None, torch_op=None,
              module: str = __name__) -> Pointwise:
    """Declare a unary pointwise op and its VJP: `body(b, x, **scalars)` -> y, `grad_body(b, saved, dy, **scalars)`
    -> dx, where saved is x or y (`saves`), and `reference_grad(saved, **scalars)` is d y / dx in numpy.

    `scalars`: name -> test values of the op's scalar arguments (f32 push constants, positional or keyword after
    x; `defaults` for those that may be left out); `push(**scalars)` turns them into the push constants (default:
    each as a float), for scalars that have a sentinel such as clamp's open bound None. Registers an OpSpec (with
    the forward and backward kernels) and returns the op functions name and name_backward, which the declaring
    module binds under those names (`module`: its __name__, which the functions and the spec report). `torch_op`:
    the PyTorch equivalent (a function of torch tensors and the same scalars) the derived parity test runs."""
    scalars, defaults = dict(scalars or {}), dict(defaults or {})
    names = tuple(scalars)
    params = [(n, f32) for n in (push(**{k: 0.0 for k in names}) if push else names)]
    fwd_kernel = map_kernel(name, lambda b, x, index, **p: body(b, x, **p), params=params, flops=flops)
    bwd_kernel = map_kernel(f"{name}_backward", lambda b, s, dy, index, **p: grad_body(b, s, dy, **p), n_in=2,
                            params=params, flops=grad_flops)

    def constants(op: str, values: tuple, given: dict) -> dict:
        if len(values) > len(names) or set(given) - set(names):
            raise TypeError(f"{op}() takes the scalar arguments {', '.join(names) or 'none'}; got {len(values)} "
                            f"positional and {', '.join(given) or 'no'} keyword ones")
        bound = defaults | dict(zip(names, values)) | given
        if missing := [n for n in names if n not in bound]:
            raise TypeError(f"{op}() is missing its scalar argument(s) {', '.join(missing)}")
        return push(**bound) if push else {k: float(v) for k, v in bound.items()}

    def forward(x: Tensor, *values, **given) -> Tensor:
        return unary_op(fwd_kernel, x, **constants(name, values, given))

    def backward(saved: Tensor, dy: Tensor, *values, **given) -> Tensor:
        return _grad_op(bwd_kernel, saved, dy, **constants(f"{name}_backward", values, given))

    forward.__name__, backward.__name__ = name, f"{name}_backward"
    forward.__doc__, backward.__doc__ = doc, grad_doc or f"dx for {name}, from the saved {saves} and dy."
    forward.__module__ = backward.__module__ = module
    generate = inputs or normal_inputs

    def reference_backward(saved: np.ndarray, dy: np.ndarray, **values) -> np.ndarray:
        return dy * reference_grad(saved, **values)

    register(OpSpec(name, doc, module, (fwd_kernel, bwd_kernel), forward, backward, reference, reference_backward,
                    lambda rng, shape, **_: (generate(rng, shape),), saves=(saves,), scalars=scalars,
                    tolerance=tolerance or POINTWISE_TOLERANCE, torch_op=torch_op,
                    samples=bounded_samples(input_bound) if input_bound else None))
    return Pointwise(forward, backward)


def _torch_gelu(x):
    import torch.nn.functional as tf  # only the parity test calls it, with torch installed

    return tf.gelu(x, approximate="tanh")


def _torch_silu(x):
    import torch.nn.functional as tf

    return tf.silu(x)


def _positive_inputs(rng: np.random.Generator, shape) -> np.ndarray:
    return (np.abs(rng.standard_normal(shape) * 3.0) + 1e-3).astype(np.float32)


def _exp_inputs(rng: np.random.Generator, shape) -> np.ndarray:
    return np.clip(rng.standard_normal(shape) * 3.0, -80, 80).astype(np.float32)


exp, exp_backward = pointwise(
    "exp", "e^x.", lambda b, x: b.exp(x), lambda b, y, dy: dy * y, np.exp, lambda y: y, saves="y",
    grad_doc="dx = dy * y, from the forward output y = e^x.", inputs=_exp_inputs,
    input_bound={"fp16": 10.0}, torch_op=lambda x: x.exp())  # e^10 and its gradient stay inside fp16's range (65504)
log, log_backward = pointwise(
    "log", "Natural logarithm.", lambda b, x: b.log(x), lambda b, x, dy: dy / x, np.log, lambda x: 1.0 / x,
    grad_doc="dx = dy / x.", inputs=_positive_inputs, torch_op=lambda x: x.log())
sqrt, sqrt_backward = pointwise(
    "sqrt", "Square root.", lambda b, x: b.sqrt(x), lambda b, y, dy: dy / (y * 2.0), np.sqrt, lambda y: 0.5 / y,
    saves="y", grad_flops=2, grad_doc="dx = dy / (2 y), from the forward output y = sqrt(x).", inputs=_positive_inputs,
    torch_op=lambda x: x.sqrt())
relu, relu_backward = pointwise(
    "relu", "max(x, 0).", lambda b, x: b.select(x > 0.0, x, 0.0), _relu_bwd, lambda x: np.maximum(x, 0.0),
    lambda x: (x > 0).astype(x.dtype), grad_doc="dy where x > 0, else 0.", torch_op=lambda x: x.relu())
gelu, gelu_backward = pointwise(
    "gelu", 'GELU, tanh approximation (torch.nn.functional.gelu(approximate="tanh")).',
    lambda b, x: gelu_value(b, x), lambda b, x, dy: dy * gelu_grad(b, x), reference_gelu, reference_gelu_grad,
    flops=16, grad_flops=22, grad_doc="dy * gelu'(x) for the tanh approximation.", torch_op=_torch_gelu)
silu, silu_backward = pointwise(
    "silu", "x * sigmoid(x).", lambda b, x: x * sigmoid(b, x), _silu_bwd, lambda x: x * reference_sigmoid(x),
    lambda x: reference_sigmoid(x) * (1.0 + x * (1.0 - reference_sigmoid(x))), flops=4, grad_flops=8,
    grad_doc="dy * s * (1 + x (1 - s)), s = sigmoid(x).", torch_op=_torch_silu)

# Exact ops: the result is an input or a bound, so within one rounding of the dtype (clamp's f32 bound of a float64
# test value is one rounding off it already).
_EXACT = {"y": Tolerance(), "dx": Tolerance()}
clamp, clamp_backward = pointwise(
    "clamp", "min(max(x, lo), hi); a None bound is open. NaN stays NaN where the driver keeps NaNs (Vulkan lets it "
    "not).", lambda b, x, lo, hi: _clamp(b, x, lo, hi), _clamp_bwd, reference_clamp, reference_clamp_grad, flops=2,
    grad_flops=2, grad_doc="dy where lo <= x <= hi (inclusive, as torch), else 0.",
    scalars={"lo": (-0.5, None, -0.1, 0.3), "hi": (0.7, 0.2, None, -0.3)}, defaults={"lo": None, "hi": None},
    push=_bounds, tolerance=_EXACT, torch_op=lambda x, lo, hi: x.clamp(lo, hi))
softcap, softcap_backward = pointwise(
    "softcap", "cap * tanh(x / cap).", lambda b, x, cap: tanh(b, x / cap) * cap, _softcap_bwd, reference_softcap,
    reference_softcap_grad, flops=16, grad_flops=18, grad_doc="dy * (1 - tanh(x / cap)^2).",
    scalars={"cap": (5.0, 30.0, 2.5)}, torch_op=lambda x, cap: (x / cap).tanh() * cap)

# Indexed by name for callers that want the references alone: derived from the specs above.
REFERENCE = {n: spec_of(n).reference for n in ("exp", "log", "sqrt", "relu", "gelu", "silu")}

