"""Pointwise activations beyond their op specs' derived tests (tests/kernels/test_opspecs.py: forward and backward
of exp, log, sqrt, relu, gelu, silu, clamp and softcap in every access and dtype against the float64 references,
finite differences, spirv-val): the references against PyTorch (kinks and bounds included), extreme inputs, small
inputs where only relative accuracy shows, clamp's NaN, infinities and inputs exactly at a bound, and the shape
error.

Tolerances: 1e-5 relative for the forward ops (lavapipe's exp/log are polynomial approximations a few ulp off; our
tanh is ~2 ulp), plus an absolute floor of 1e-6 at the zeros of gelu/silu where relative error is meaningless;
2e-5 relative for gelu's gradient.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import helios.runtime as rt
from helios.kernels.contract.spec import spec_of
from helios.kernels.pointwise import activations as A

_TORCH = {
    "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "relu": torch.relu,
    "gelu": lambda t: torch.nn.functional.gelu(t, approximate="tanh"), "silu": torch.nn.functional.silu,
    "clamp": lambda t, lo, hi: torch.clamp(t, lo, hi), "softcap": lambda t, cap: cap * torch.tanh(t / cap),
}


@pytest.mark.parametrize("op", list(_TORCH))
def test_references_match_torch(op):
    """Each spec's float64 reference and reference VJP against torch autograd, for every scalar case, with inputs at
    the kinks (relu at 0: torch passes no gradient there; clamp exactly at a bound: torch passes it)."""
    spec = spec_of(op)
    rng = np.random.default_rng(1)
    for scalars in spec.scalar_cases():
        (x,) = spec.inputs(rng, (9, 13), **scalars)
        x = x.astype(np.float64)
        if op in ("relu", "clamp"):
            x.reshape(-1)[:3] = [0.0, scalars.get("lo") or 0.0, scalars.get("hi") or 0.0]
        dy = rng.standard_normal(x.shape)
        xt = torch.from_numpy(x).requires_grad_(True)
        y = _TORCH[op](xt, **scalars)
        y.backward(torch.from_numpy(dy))
        np.testing.assert_allclose(spec.reference(x, **scalars), y.detach().numpy(), rtol=1e-12, atol=1e-14)
        saved = y.detach().numpy() if spec.saves == ("y",) else x
        np.testing.assert_allclose(spec.reference_backward(saved, dy, **scalars), xt.grad.numpy(), rtol=1e-12,
                                   atol=1e-14, err_msg=f"{op} {scalars}")


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


def test_clamp_special_values(access):
    """NaN, +-inf and inputs exactly at a bound, forward and backward, bit for bit against torch (the spec's
    inputs are random normals, which never sit on a bound)."""
    x = np.random.default_rng(3).standard_normal((7, 33)).astype(np.float32)
    dy = np.random.default_rng(4).standard_normal(x.shape).astype(np.float32)
    for lo, hi in [(-0.5, 0.7), (None, 0.2), (-0.1, None), (0.3, -0.3)]:
        x[0, :5] = [np.nan, lo or 0.0, hi or 0.0, np.inf, -np.inf]
        got = A.clamp(rt.from_numpy(x), lo, hi).numpy()
        xt = torch.from_numpy(x).requires_grad_(True)
        want = torch.clamp(xt, lo, hi)
        want.backward(torch.from_numpy(dy))
        # Vulkan lets drivers assume no NaNs (NVIDIA folds compare+select into min/max), so NaN propagation is
        # checked only on lavapipe, which keeps it.
        keep = np.ones(x.shape, bool) if rt.get_runtime().info.is_cpu else ~np.isnan(x)
        np.testing.assert_array_equal(got[keep], want.detach().numpy()[keep])
        dx = A.clamp_backward(rt.from_numpy(x), rt.from_numpy(dy), lo, hi).numpy()
        grad = np.where(np.isnan(x), 0.0, xt.grad.numpy())  # torch passes dy at NaN; helios (and our reference) not
        np.testing.assert_array_equal(dx, grad)


def test_shape_mismatch_and_bad_scalars_raise():
    with pytest.raises(ValueError, match="differ"):
        A.gelu_backward(rt.zeros(4), rt.zeros(5))
    with pytest.raises(TypeError, match=r"softcap\(\) is missing its scalar argument\(s\) cap"):
        A.softcap(rt.zeros(4))
    with pytest.raises(TypeError, match=r"clamp\(\) takes the scalar arguments lo, hi"):
        A.clamp(rt.zeros(4), 0.0, 1.0, 2.0)
