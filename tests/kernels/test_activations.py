"""Pointwise math and activations (exp, log, sqrt, relu, gelu-tanh, silu, clamp, softcap) and their backward,
against float64 numpy references and PyTorch autograd, in the scalar and vec4 variants.

Tolerances: 1e-5 relative for the forward ops (lavapipe's exp/log are polynomial approximations a few ulp
off; our tanh is ~2 ulp), plus an absolute floor of 1e-6 at the zeros of gelu/silu/log where relative error
is meaningless; 2e-5 relative for backward ops, which compose two or three of those approximations.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import helios.runtime as rt
from helios.kernels import activations as A

KERNELS = [A.EXP, A.LOG, A.SQRT, A.RELU, A.GELU, A.SILU, A.CLAMP, A.SOFTCAP, A.RELU_BWD, A.GELU_BWD, A.SILU_BWD,
           A.EXP_BWD, A.LOG_BWD, A.SQRT_BWD, A.CLAMP_BWD, A.SOFTCAP_BWD]
SHAPES = [(1,), (7,), (33, 513), (1, 4097), (33, 12)]


@pytest.mark.parametrize("kernel,variant", [(k, v) for k in KERNELS for v in k.variants],
                         ids=lambda x: getattr(x, "name", x))
def test_spirv_valid(kernel, variant, spirv_val):
    spirv_val.check(kernel, variant)


def _inputs(op: str, shape, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 3.0
    if op in ("log", "sqrt"):
        x = np.abs(x) + 1e-3
    if op == "exp":
        x = np.clip(x, -80, 80)
    return x.astype(np.float32)


@pytest.mark.parametrize("op", ["exp", "log", "sqrt", "relu", "gelu", "silu"])
def test_forward_against_reference(op, access):
    for shape in SHAPES:
        x = _inputs(op, shape)
        got = getattr(A, op)(rt.from_numpy(x)).numpy()
        np.testing.assert_allclose(got, A.REFERENCE[op](x.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_extreme_inputs_give_no_nan(access):
    x = np.array([-1e30, -1e4, -100, -20, -9, -1e-30, 0, 1e-30, 9, 20, 100, 1e4, 1e30], np.float32)
    xt = rt.from_numpy(x)
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        for op in ("gelu", "silu"):
            np.testing.assert_allclose(getattr(A, op)(xt).numpy(), A.REFERENCE[op](x64), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(A.gelu_backward(xt, rt.from_numpy(np.ones_like(x))).numpy(),
                                   A.reference_gelu_grad(x64), rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(A.softcap(xt, 30.0).numpy(), A.reference_softcap(x64, 30.0), rtol=1e-5, atol=0)


def test_softcap_and_tanh_accurate_near_zero(access):
    """cap * tanh(x / cap) ~ x for small x: relative accuracy must hold there (GLSL Tanh on lavapipe loses it)."""
    x = np.array([1e-7, -3e-6, 1e-4, 0.01, -0.3, 0.62, 0.63, 1.0, -5.0, 30.0], np.float32) * 15.0
    got = A.softcap(rt.from_numpy(x), 15.0).numpy()
    np.testing.assert_allclose(got, A.reference_softcap(x.astype(np.float64), 15.0), rtol=1e-6, atol=0)


@pytest.mark.parametrize("lo,hi", [(-0.5, 0.7), (None, 0.2), (-0.1, None), (0.3, -0.3)])
def test_clamp(lo, hi, access):
    x = _inputs("clamp", (7, 33))
    x[0, :4] = [np.nan, lo or 0.0, hi or 0.0, np.inf]
    got = A.clamp(rt.from_numpy(x), lo, hi).numpy()
    want = torch.clamp(torch.from_numpy(x), lo, hi).numpy()
    # Vulkan lets drivers assume no NaNs (NVIDIA folds compare+select into min/max), so NaN propagation is
    # checked only on lavapipe, which keeps it.
    keep = np.ones(x.shape, bool) if rt.get_runtime().info.is_cpu else ~np.isnan(x)
    np.testing.assert_array_equal(got[keep], want[keep])
    np.testing.assert_array_equal(got[keep], A.reference_clamp(x, lo, hi)[keep])


def test_clamp_min():
    x = _inputs("clamp", (5, 9))
    np.testing.assert_array_equal(A.clamp_min(rt.from_numpy(x), 0.25).numpy(), np.maximum(x, np.float32(0.25)))


_TORCH = {
    "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "relu": torch.relu,
    "gelu": lambda t: torch.nn.functional.gelu(t, approximate="tanh"), "silu": torch.nn.functional.silu,
}


@pytest.mark.parametrize("op", list(_TORCH))
def test_backward_against_torch(op, access):
    for shape in [(7,), (33, 65)]:
        x = _inputs(op, shape, seed=1)
        if op == "relu":
            x.reshape(-1)[:3] = 0.0  # the kink: torch passes no gradient at exactly 0
        dy = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
        xt = torch.from_numpy(x.astype(np.float64)).requires_grad_(True)
        y = _TORCH[op](xt)
        y.backward(torch.from_numpy(dy.astype(np.float64)))
        saved = y.detach().numpy().astype(np.float32) if op in ("exp", "sqrt") else x
        got = getattr(A, f"{op}_backward")(rt.from_numpy(saved), rt.from_numpy(dy)).numpy()
        np.testing.assert_allclose(got, xt.grad.numpy(), rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("lo,hi", [(-0.5, 0.7), (None, 0.2), (-0.1, None)])
def test_clamp_backward_against_torch(lo, hi, access):
    x = _inputs("clamp", (9, 13), seed=3)
    x[0, :2] = [lo or 0.0, hi or 0.0]  # exactly at a bound: torch passes the gradient
    dy = np.random.default_rng(4).standard_normal(x.shape).astype(np.float32)
    xt = torch.from_numpy(x).requires_grad_(True)
    torch.clamp(xt, lo, hi).backward(torch.from_numpy(dy))
    got = A.clamp_backward(rt.from_numpy(x), rt.from_numpy(dy), lo, hi).numpy()
    np.testing.assert_array_equal(got, xt.grad.numpy())


def test_softcap_backward_against_torch(access):
    cap = 5.0
    x = _inputs("softcap", (33, 17), seed=5) * 4
    dy = np.random.default_rng(6).standard_normal(x.shape).astype(np.float32)
    xt = torch.from_numpy(x.astype(np.float64)).requires_grad_(True)
    (cap * torch.tanh(xt / cap)).backward(torch.from_numpy(dy.astype(np.float64)))
    got = A.softcap_backward(rt.from_numpy(x), rt.from_numpy(dy), cap).numpy()
    np.testing.assert_allclose(got, xt.grad.numpy(), rtol=2e-5, atol=1e-6)


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="differ"):
        A.gelu_backward(rt.zeros(4), rt.zeros(5))
