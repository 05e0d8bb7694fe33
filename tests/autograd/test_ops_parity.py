"""The hand-written autograd ops against torch.autograd: same inputs, same upstream gradient, awkward shapes. Spec
ops that name their torch equivalent (softmax, the norms, matmul, ...) are tests/kernels/test_torch_parity.py's.

Each case builds the op from autograd.functional and the same math in torch, backpropagates a random
upstream gradient through both, and compares the output and every input gradient (1e-4 relative).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import autograd
from autograd import functional as F

RTOL = 1e-4


def _rand(shape, seed, scale=1.0, positive=False):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale
    return np.abs(x) + 0.5 if positive else x


def _close(mine: np.ndarray, ref: np.ndarray, what: str) -> None:
    err = np.linalg.norm(mine - ref) / max(np.linalg.norm(ref), 1e-12)
    assert err < RTOL, f"{what}: relative error {err:.2e}"


def _check(helios_fn, torch_fn, inputs: list[np.ndarray], grad_mask=None, seed=99):
    """Run both, backprop the same random upstream gradient, compare outputs and input gradients."""
    grad_mask = grad_mask or [True] * len(inputs)
    mine = [autograd.tensor(x, requires_grad=g) for x, g in zip(inputs, grad_mask)]
    theirs = [torch.tensor(x, requires_grad=g) for x, g in zip(inputs, grad_mask)]
    out = helios_fn(*mine)
    ref = torch_fn(*theirs)
    _close(out.numpy(), ref.detach().numpy(), "output")
    upstream = _rand(ref.shape, seed)
    out.backward(upstream)
    ref.backward(torch.tensor(upstream))
    for i, (m, t) in enumerate(zip(mine, theirs)):
        if grad_mask[i]:
            _close(m.grad.numpy(), t.grad.numpy(), f"grad of input {i}")


SHAPE = (7, 33)


@pytest.mark.parametrize("name,hf,tf,b_shape", [
    ("add", F.add, torch.add, SHAPE), ("add_row", F.add, torch.add, (33,)), ("add_col", F.add, torch.add, (7, 1)),
    ("sub", F.sub, torch.sub, SHAPE), ("sub_row", F.sub, torch.sub, (33,)),
    ("mul", F.mul, torch.mul, SHAPE), ("mul_row", F.mul, torch.mul, (33,)), ("mul_col", F.mul, torch.mul, (7, 1)),
    ("div", F.div, torch.div, SHAPE), ("div_row", F.div, torch.div, (33,)),
])
def test_binary(name, hf, tf, b_shape):
    a, b = _rand(SHAPE, 1), _rand(b_shape, 2, positive=name.startswith("div"))
    _check(hf, tf, [a, b])


@pytest.mark.parametrize("name,hf,tf,positive", [
    ("neg", F.neg, torch.neg, False),
    ("clone", F.clone, torch.clone, False), ("scale", lambda x: F.scale(x, -1.75), lambda x: x * -1.75, False),
    ("sum_last", lambda x: F.sum(x, -1), lambda x: x.sum(-1), False),
    ("sum_all", lambda x: F.sum(x, None), lambda x: x.sum().reshape(1), False),
    ("mean_last", lambda x: F.mean(x, -1), lambda x: x.mean(-1), False),
    ("mean_all", lambda x: F.mean(x, None), lambda x: x.mean().reshape(1), False),
    ("reshape", lambda x: F.reshape(x, (33, 7)), lambda x: x.reshape(33, 7), False),
])
def test_unary(name, hf, tf, positive):
    _check(hf, tf, [_rand(SHAPE, 3, positive=positive)])


def test_masked_fill():
    mask = (np.random.default_rng(4).random(SHAPE) < 0.3).astype(np.float32)
    _check(lambda x: F.masked_fill(x, autograd.tensor(mask), -2.0),
           lambda x: x.masked_fill(torch.tensor(mask, dtype=torch.bool), -2.0), [_rand(SHAPE, 5)])


def test_dropout_zero_and_residual_add_match_identity():
    _check(lambda x: F.dropout(x, 0.0, 1, 1), lambda x: x * 1.0, [_rand(SHAPE, 8)])
    _check(lambda x, y: F.residual_dropout_add(x, y, 0.0, 1, 1), torch.add, [_rand(SHAPE, 8), _rand(SHAPE, 9)])


def test_dropout_gradient_uses_the_forward_mask():
    x = autograd.tensor(_rand((5, 37), 10), requires_grad=True)
    y = F.dropout(x, 0.3, seed=7, offset=3)
    y.backward(np.ones((5, 37), np.float32))
    kept = y.numpy() != 0
    np.testing.assert_allclose(x.grad.numpy(), np.where(kept, 1 / 0.7, 0.0), rtol=1e-6)
    x2, y2 = autograd.tensor(_rand((5, 37), 10), requires_grad=True), autograd.tensor(_rand((5, 37), 11),
                                                                                       requires_grad=True)
    out = F.residual_dropout_add(x2, y2, 0.3, seed=7, offset=3)
    out.backward(np.ones((5, 37), np.float32))
    np.testing.assert_allclose(x2.grad.numpy(), 1.0)
    np.testing.assert_array_equal(y2.grad.numpy() != 0, (out.numpy() - x2.numpy()) != 0)


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False)])
def test_matmul(ta, tb):
    a = _rand((33, 7) if ta else (7, 33), 17)
    b = _rand((17, 33) if tb else (33, 17), 18)
    _check(lambda x, y: F.matmul(x, y, ta, tb),
           lambda x, y: (x.T if ta else x) @ (y.T if tb else y), [a, b])


def test_batched_matmul():
    _check(F.matmul, torch.matmul, [_rand((3, 7, 9), 19), _rand((3, 9, 5), 20)])
    _check(F.matmul, torch.matmul, [_rand((3, 7, 9), 19), _rand((9, 5), 20)])  # b shared: dB summed over the batch


@pytest.mark.parametrize("bias,gelu,residual", [(True, False, False), (False, False, False), (True, True, False),
                                                 (True, False, True), (True, True, True)])
def test_linear(bias, gelu, residual):
    inputs = [_rand((3, 5, 33), 21), _rand((17, 33), 22, 0.2)]
    if bias:
        inputs.append(_rand((17,), 23))
    if residual:
        inputs.append(_rand((3, 5, 17), 24))

    def mine(x, w, *rest):
        b = rest[0] if bias else None
        r = rest[-1] if residual else None
        return F.linear(x, w, b, residual=r, gelu=gelu)

    def ref(x, w, *rest):
        y = TF.linear(x, w, rest[0] if bias else None)
        y = TF.gelu(y, approximate="tanh") if gelu else y
        return y + rest[-1] if residual else y

    _check(mine, ref, inputs)


def _mlp_inputs(bias: bool, residual: bool) -> list[np.ndarray]:
    """x [3, 5, 33], W1 [17, 33], (b1), W2 [33, 17], (b2), (residual): widths of no block, 15 rows."""
    fc = [_rand((17, 33), 31, 0.3)] + ([_rand((17,), 32)] if bias else [])
    proj = [_rand((33, 17), 33, 0.3)] + ([_rand((33,), 34)] if bias else [])
    return [_rand((3, 5, 33), 30), *fc, *proj] + ([_rand((3, 5, 33), 35)] if residual else [])


def _mlp_args(bias: bool, residual: bool, args: tuple) -> tuple:
    """(x, w1, b1, w2, b2, residual) from _mlp_inputs' order, None where absent."""
    args = list(args)
    x, w1 = args.pop(0), args.pop(0)
    b1 = args.pop(0) if bias else None
    w2 = args.pop(0)
    b2 = args.pop(0) if bias else None
    return x, w1, b1, w2, b2, (args.pop(0) if residual else None)


@pytest.mark.parametrize("bias,residual,grad_mask", [
    (True, True, None), (False, True, None), (True, False, None),
    (True, True, [False, True, True, True, True, True]),  # the first block's x: no input gradient
    (True, True, [True, False, False, True, True, False]),  # c_fc frozen, the residual a constant
    (True, True, [False, False, False, True, True, True]),  # only c_proj and the residual: no dpre at all
])
def test_mlp(bias, residual, grad_mask):
    def mine(*args):
        x, w1, b1, w2, b2, r = _mlp_args(bias, residual, args)
        return F.mlp(x, w1, b1, w2, b2, residual=r)

    def ref(*args):
        x, w1, b1, w2, b2, r = _mlp_args(bias, residual, args)
        y = TF.linear(TF.gelu(TF.linear(x, w1, b1), approximate="tanh"), w2, b2)
        return y + r if residual else y

    _check(mine, ref, _mlp_inputs(bias, residual), grad_mask)


def test_mlp_is_two_linears_bit_for_bit_with_one_dispatch_fewer():
    """F.mlp's output and every gradient are the very bits of F.linear twice (f32), and its backward runs one
    dispatch fewer: GELU's derivative inside the product, not an elementwise pass of its own."""
    from helios import runtime as rt

    upstream = _rand((3, 5, 33), 36)
    results, dispatches = [], []
    for fused in (True, False):
        x, w1, b1, w2, b2, r = (autograd.tensor(v, requires_grad=True) for v in _mlp_inputs(True, True))
        y = (F.mlp(x, w1, b1, w2, b2, residual=r) if fused else
             F.linear(F.linear(x, w1, b1, gelu=True), w2, b2, residual=r))
        rt.sync()
        before = rt.counters()["dispatches"]
        y.backward(upstream)
        dispatches.append(rt.counters()["dispatches"] - before)
        results.append([y.numpy()] + [t.grad.numpy() for t in (x, w1, b1, w2, b2, r)])
    for fused, unfused in zip(*results):
        np.testing.assert_array_equal(fused, unfused)
    assert dispatches[0] == dispatches[1] - 1, dispatches


@pytest.mark.parametrize("with_pos", [False, True])
def test_embedding(with_pos):
    ids = np.random.default_rng(25).integers(0, 29, size=(3, 11), dtype=np.int32)
    ids[0, :3] = 5  # repeated ids: the backward must add their rows
    inputs = [_rand((29, 12), 26)] + ([_rand((11, 12), 27)] if with_pos else [])

    def mine(table, *pos):
        return F.embedding(autograd.tensor(ids), table, pos[0] if pos else None, host_ids=ids)

    def ref(table, *pos):
        out = table[torch.tensor(ids, dtype=torch.long)]
        return out + pos[0][None] if pos else out

    _check(mine, ref, inputs)


def _torch_rope(qkv, H, Hkv, D, base=10000.0):
    B, T, _ = qkv.shape
    half = D // 2
    inv = base ** (-torch.arange(half, dtype=torch.float64) * 2 / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = ang.cos().float(), ang.sin().float()
    heads = qkv.view(B, T, H + 2 * Hkv, D)
    rot = heads[:, :, :H + Hkv]
    x1, x2 = rot[..., :half], rot[..., half:]
    c, s = cos[None, :, None], sin[None, :, None]
    rotated = torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)
    return torch.cat([rotated, heads[:, :, H + Hkv:]], dim=2).reshape(B, T, -1)


def test_rope():
    H, Hkv, D = 4, 2, 16
    _check(lambda q: F.rope(q, H, Hkv, D, 10000.0), lambda q: _torch_rope(q, H, Hkv, D),
           [_rand((2, 9, (H + 2 * Hkv) * D), 28)])


def _torch_attention(qkv, B, T, H, Hkv, D, softcap):
    q, k, v = qkv.view(B, T, H + 2 * Hkv, D).split([H, Hkv, Hkv], dim=2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    s = q @ k.transpose(-2, -1) / D ** 0.5
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * D)


@pytest.mark.parametrize("H,Hkv,softcap", [(3, 3, 0.0), (4, 2, 0.0), (2, 1, 5.0)])
def test_flash_attention(H, Hkv, softcap):
    B, T, D = 2, 13, 16
    _check(lambda q: F.flash_attention(q, B, T, H, Hkv, D, softcap=softcap),
           lambda q: _torch_attention(q, B, T, H, Hkv, D, softcap), [_rand((B, T, (H + 2 * Hkv) * D), 29)])


def test_cross_entropy():
    targets = np.random.default_rng(30).integers(0, 517, size=(3, 7), dtype=np.int32)
    targets[1, 2] = -1  # ignored
    tt = torch.tensor(targets, dtype=torch.long)
    _check(lambda x: F.cross_entropy(x, autograd.tensor(targets), ignore_index=-1),
           lambda x: TF.cross_entropy(x.view(-1, 517), tt.view(-1), ignore_index=-1).reshape(1),
           [_rand((3, 7, 517), 31, 2.0)])


def test_concat():
    _check(lambda a, b, c: F.concat([a, b, c]), lambda a, b, c: torch.cat([a, b, c], dim=-1),
           [_rand((3, 5, 7), 32), _rand((3, 5, 1), 33), _rand((3, 5, 13), 34)], grad_mask=[True, False, True])
