"""RoPE on the fused QKV layout against the numpy reference, torch autograd and the trainer's torch backend.

Tolerance ~1e-5 relative: each output is two products and a sum of f32 values with an f32 cos/sin table.
"""

from __future__ import annotations

import numpy as np
import pytest

import helios.runtime as rt
from helios.kernels import rope as R
from tests.spirv_val import spirv_cases

# (B, T, H, Hkv, D): head_dim 2 and 6 take the scalar variant, 16 and 64 the vec4 one
SHAPES = [(1, 1, 1, 1, 2), (2, 7, 3, 1, 6), (1, 33, 4, 2, 16), (3, 5, 2, 2, 64), (1, 513, 2, 1, 8)]


@pytest.mark.parametrize("kernel,variant", spirv_cases([R.ROPE]))
def test_spirv_valid(kernel, variant, spirv_val):
    spirv_val.check(kernel, variant)


def _qkv(b, t, h, hkv, d, seed=0):
    return np.random.default_rng(seed).standard_normal((b, t, (h + 2 * hkv) * d)).astype(np.float32)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
def test_against_reference(shape, backward, inplace):
    b, t, h, hkv, d = shape
    x = _qkv(*shape)
    base = 10000.0 if d > 8 else 500.0
    xt = rt.from_numpy(x)
    y = R.rope(xt, h, hkv, d, base, backward=backward, out=xt if inplace else None)
    assert (y is xt) == inplace
    expected = R.reference(x.astype(np.float64), h, hkv, d, base, backward=backward)
    got = y.numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[..., (h + hkv) * d:], x[..., (h + hkv) * d:])  # v untouched


def test_backward_undoes_forward():
    x = _qkv(2, 9, 2, 1, 8, seed=1)
    y = R.rope(rt.from_numpy(x), 2, 1, 8, 10000.0)
    back = R.rope(y, 2, 1, 8, 10000.0, backward=True)
    np.testing.assert_allclose(back.numpy(), x, rtol=1e-5, atol=1e-5)


def test_reference_backward_is_adjoint():
    """<rope(x), dy> == <x, rope_backward(dy)> in float64: the backward is the exact VJP of a linear map."""
    rng = np.random.default_rng(2)
    x, dy = rng.standard_normal((2, 6, 5 * 4)), rng.standard_normal((2, 6, 5 * 4))
    lhs = np.sum(R.reference(x, 3, 1, 4, 100.0) * dy)
    rhs = np.sum(x * R.reference(dy, 3, 1, 4, 100.0, backward=True))
    assert abs(lhs - rhs) < 1e-10


def _torch_rope(torch, qkv, h, hkv, d, base):
    """rotate_half RoPE in torch on [B, T, (H + 2Hkv) * D], from angles computed in float64."""
    b, t, _ = qkv.shape
    cos, sin = (torch.tensor(a, dtype=torch.float32) for a in R.rope_table(t, d, base))
    heads = qkv[..., : (h + hkv) * d].reshape(b, t, h + hkv, d)
    x1, x2 = heads[..., : d // 2], heads[..., d // 2:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    rot = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).reshape(b, t, -1)
    return torch.cat([rot, qkv[..., (h + hkv) * d:]], dim=-1)


@pytest.mark.parametrize("shape", [(2, 7, 3, 1, 6), (1, 33, 4, 2, 16)])
def test_vjp_against_torch_autograd(shape):
    torch = pytest.importorskip("torch")
    b, t, h, hkv, d = shape
    x = _qkv(*shape, seed=3)
    dy = _qkv(*shape, seed=4)
    tx = torch.tensor(x, requires_grad=True)
    ty = _torch_rope(torch, tx, h, hkv, d, 10000.0)
    ty.backward(torch.tensor(dy))
    y = R.rope(rt.from_numpy(x), h, hkv, d, 10000.0)
    dx = R.rope(rt.from_numpy(dy), h, hkv, d, 10000.0, backward=True)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_matches_trainer_torch_backend():
    """The torch reference backend uses the same (half-split) convention and table."""
    torch = pytest.importorskip("torch")
    tm = pytest.importorskip("trainer.backends.torch_model")
    b, t, h, hkv, d = 2, 6, 2, 1, 8
    x = _qkv(b, t, h, hkv, d, seed=5)
    cos, sin = (torch.tensor(a, dtype=torch.float32) for a in R.rope_table(t, d, 10000.0))
    q = torch.tensor(x[..., : h * d]).reshape(b, t, h, d).transpose(1, 2)  # [B, H, T, D]
    expected = tm.apply_rope(q, cos, sin).transpose(1, 2).reshape(b, t, h * d).numpy()
    got = R.rope(rt.from_numpy(x), h, hkv, d, 10000.0).numpy()[..., : h * d]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_large_positions_use_an_accurate_table():
    b, t, h, hkv, d = 1, 2048, 1, 1, 8
    x = _qkv(b, t, h, hkv, d, seed=6)
    got = R.rope(rt.from_numpy(x), h, hkv, d, 10000.0).numpy()
    np.testing.assert_allclose(got, R.reference(x.astype(np.float64), h, hkv, d, 10000.0), rtol=1e-5, atol=2e-6)
