"""Tape semantics users know from PyTorch: no_grad, detach, retain_graph, accumulation, grad(), Function."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import autograd
from autograd import functional as F
from helios import ops
from helios import runtime as rt


def _pair(shape, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(np.float32)


def test_mul_add_gradients_match_torch():
    a_np, b_np, c_np = _pair((7, 33), 1), _pair((7, 33), 2), _pair((33,), 3)
    a, b, c = (autograd.tensor(v, requires_grad=True) for v in (a_np, b_np, c_np))
    (F.add(a * b, c)).sum(axis=None).backward()
    ta, tb, tc = (torch.tensor(v, requires_grad=True) for v in (a_np, b_np, c_np))
    (ta * tb + tc).sum().backward()
    for mine, theirs in ((a, ta), (b, tb), (c, tc)):
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_no_grad_records_nothing():
    a = autograd.tensor(_pair((4, 5)), requires_grad=True)
    with autograd.no_grad():
        y = a * a
    assert y.grad_fn is None and not y.requires_grad
    z = a * a
    assert z.grad_fn is not None and z.requires_grad


def test_detach_cuts_the_graph():
    a = autograd.tensor(_pair((3, 8)), requires_grad=True)
    d = (a * a).detach()
    assert d.grad_fn is None and not d.requires_grad
    b = autograd.tensor(_pair((3, 8), 5), requires_grad=True)
    (d * b).sum(axis=None).backward()
    assert a.grad is None
    np.testing.assert_allclose(b.grad.numpy(), d.numpy(), rtol=1e-6)


def test_second_backward_needs_retain_graph():
    a = autograd.tensor(_pair((2, 9)), requires_grad=True)
    loss = (a * a).sum(axis=None)
    loss.backward()
    with pytest.raises(RuntimeError, match="retain_graph"):
        loss.backward()


def test_retain_graph_allows_a_second_backward_and_accumulates():
    a_np = _pair((5, 6))
    a = autograd.tensor(a_np, requires_grad=True)
    loss = (a * a).sum(axis=None)
    loss.backward(retain_graph=True)
    loss.backward()
    np.testing.assert_allclose(a.grad.numpy(), 4 * a_np, rtol=1e-5)


def test_gradients_accumulate_until_zeroed():
    a_np = _pair((3, 4))
    a = autograd.tensor(a_np, requires_grad=True)
    for _ in range(2):
        (a * a).sum(axis=None).backward()
    np.testing.assert_allclose(a.grad.numpy(), 4 * a_np, rtol=1e-5)
    a.zero_grad()
    (a * a).sum(axis=None).backward()
    np.testing.assert_allclose(a.grad.numpy(), 2 * a_np, rtol=1e-5)


def test_functional_grad_leaves_dot_grad_alone():
    a_np, b_np = _pair((4, 4), 1), _pair((4, 4), 2)
    a, b = autograd.tensor(a_np, requires_grad=True), autograd.tensor(b_np, requires_grad=True)
    (ga, gb) = autograd.grad((a * b).sum(axis=None), [a, b])
    np.testing.assert_allclose(ga.numpy(), b_np, rtol=1e-6)
    np.testing.assert_allclose(gb.numpy(), a_np, rtol=1e-6)
    assert a.grad is None and b.grad is None


class Cube(autograd.Function):
    """y = x^3 written as a custom op: forward saves x, backward returns 3 x^2 dy."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return ops.mul(ops.mul(x, x), x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return ops.scale(ops.mul(ops.mul(x, x), dy), 3.0)


def test_custom_function():
    x_np = _pair((6, 7))
    x = autograd.tensor(x_np, requires_grad=True)
    y = Cube.apply(x)
    np.testing.assert_allclose(y.numpy(), x_np ** 3, rtol=1e-5)
    y.sum(axis=None).backward()
    np.testing.assert_allclose(x.grad.numpy(), 3 * x_np ** 2, rtol=1e-5)


def test_in_place_change_of_a_saved_tensor_is_an_error():
    x = autograd.tensor(_pair((3, 3)))  # not a leaf that needs grad, so in-place is allowed
    w = autograd.tensor(_pair((3, 3), 1), requires_grad=True)
    y = (x * w).sum(axis=None)  # Mul saves x
    x.add_(autograd.tensor(np.ones((3, 3), np.float32)))
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.backward()


def test_in_place_on_a_leaf_that_requires_grad_is_refused():
    w = autograd.tensor(_pair((2, 2)), requires_grad=True)
    with pytest.raises(RuntimeError, match="no_grad"):
        w.fill_(0.0)
    with autograd.no_grad():
        w.fill_(0.0)
    np.testing.assert_array_equal(w.numpy(), 0)


def test_dead_gradients_run_no_kernel():
    a = autograd.tensor(_pair((8, 8)), requires_grad=True)
    b = autograd.tensor(_pair((8, 8), 1))  # needs no gradient
    y = (a * b).sum(axis=None)
    rt.sync()
    before = rt.counters()["dispatches"]
    y.backward()
    rt.sync()
    used = rt.counters()["dispatches"] - before
    # sum backward (fill + broadcast add), mul backward for a only (one mul), first-grad clone: 4 at most.
    assert used <= 4, used


def test_backward_of_a_non_scalar_needs_a_gradient():
    a = autograd.tensor(_pair((2, 3)), requires_grad=True)
    with pytest.raises(RuntimeError, match="scalar"):
        (a * a).backward()
    (a * a).backward(np.ones((2, 3), np.float32))
    np.testing.assert_allclose(a.grad.numpy(), 2 * a.numpy(), rtol=1e-6)
