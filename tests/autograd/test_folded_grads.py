"""Folding a pending gradient into a backward's own (Context.pending_grad, Folded): the gradients equal those of the
plain route bit for bit, where something is pending and where nothing is yet, and pending_grad offers nothing for
leaves, for tensors autograd.grad captures, for a tensor given twice, or inside activation checkpointing's
recompute for its input; the norms' derived Functions fold their dx and save one dispatch each."""

from __future__ import annotations

import numpy as np
import pytest

import autograd
from autograd import functional as F
from autograd.checkpoint import checkpoint
from autograd.function import Context
from helios import ops
from helios import runtime as rt


class Scale(autograd.Function):
    """y = c * x, whose backward folds the pending gradient of x when `fold` is on and logs what it was offered."""

    fold = True
    offered: list[bool] = []

    @staticmethod
    def forward(ctx, x, *, c):
        ctx.c = c
        return ops.scale(x, c)

    @staticmethod
    def backward(ctx, dy):
        own = ops.scale(dy, ctx.c)
        pending = ctx.pending_grad(0)
        Scale.offered.append(pending is not None)
        if pending is None or not Scale.fold:
            return own
        return autograd.Folded(ops.add(own, pending))


class Pair(autograd.Function):
    """y = a * b, logging what pending_grad offers for each input."""

    offered: list[tuple[bool, bool]] = []

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return ops.mul(a, b)

    @staticmethod
    def backward(ctx, dy):
        a, b = ctx.saved_tensors
        Pair.offered.append((ctx.pending_grad(0) is not None, ctx.pending_grad(1) is not None))
        return ops.mul(dy, b), ops.mul(dy, a)


@pytest.fixture
def scale():
    Scale.offered, Scale.fold, Pair.offered = [], True, []
    yield Scale
    Scale.fold = True


def _array(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _leaves():
    return (autograd.tensor(_array((5, 12), 0), requires_grad=True),
            autograd.tensor(_array((5, 12), 1), requires_grad=True))


def _residual(x, w):
    """h = x * w; y = h + Scale(h): the add runs first in backward, so h's gradient is pending at Scale's."""
    h = x * w
    return h, h + Scale.apply(h, c=1.5)


def _loss(y):
    return (y * y).sum(axis=None)


def _bits(t) -> np.ndarray:
    return t.numpy().view(np.uint32)


def _grads(fold: bool, graph=_residual):
    Scale.fold = fold
    x, w = _leaves()
    _loss(graph(x, w)[1]).backward()
    return _bits(x.grad), _bits(w.grad)


def test_folded_gradient_equals_the_plain_one(scale):
    plain = _grads(fold=False)
    assert scale.offered == [True]
    folded = _grads(fold=True)
    assert scale.offered == [True, True]
    for a, b in zip(folded, plain, strict=True):
        np.testing.assert_array_equal(a, b)


def _first_scaled(x, w):
    """h = x * w; z = 2 h before Scale(h): z's backward comes after Scale's, so nothing is pending for h yet."""
    h = x * w
    z = h * 2.0
    return h, z + Scale.apply(h, c=1.5)


def test_nothing_pending_offers_none(scale):
    plain = _grads(fold=False, graph=_first_scaled)
    folded = _grads(fold=True, graph=_first_scaled)
    assert scale.offered == [False, False]
    for a, b in zip(folded, plain, strict=True):
        np.testing.assert_array_equal(a, b)


def test_leaves_and_repeated_inputs_are_not_offered(scale):
    x, w = _leaves()
    _loss(x + Scale.apply(x, c=2.0)).backward()  # x is a leaf: its gradient goes to .grad, not a pending slot
    h = x * w
    _loss(h + Pair.apply(h, h)).backward()  # h at both indices: each index's gradient is its own
    assert scale.offered == [False] and Pair.offered == [(False, False)]
    h = x * w
    _loss(h + Pair.apply(h, w)).backward()  # h pending (the add ran first); w is a leaf
    assert Pair.offered[-1] == (True, False)


def test_grad_does_not_fold_into_a_captured_input(scale):
    x, w = _leaves()
    h, y = _residual(x, w)
    (dh,) = autograd.grad(_loss(y), inputs=[h])
    assert scale.offered == [False]
    Scale.fold = False
    h, y = _residual(x, w)
    (want,) = autograd.grad(_loss(y), inputs=[h])
    np.testing.assert_array_equal(_bits(dh), _bits(want))
    assert x.grad is None and w.grad is None
    h, y = _residual(x, w)  # h is not captured: its gradient still folds on the way to x
    Scale.fold = True
    (dx,) = autograd.grad(_loss(y), inputs=[x])
    assert scale.offered[-1] is True
    Scale.fold = False
    h, y = _residual(x, w)
    (want,) = autograd.grad(_loss(y), inputs=[x])
    np.testing.assert_array_equal(_bits(dx), _bits(want))


def test_checkpointed_block_folds_inside_and_not_into_its_input(scale):
    def block(t):  # t is a captured leaf in the recompute; h = t * w inside is not
        h = t * w
        return h + Scale.apply(h, c=0.5) + Scale.apply(t, c=3.0)

    results = []
    for fold in (False, True):
        Scale.fold = fold
        x, w = _leaves()
        start = x * 1.0  # a non-leaf input, so checkpoint records
        _loss(checkpoint(block, start)).backward()
        results.append((_bits(x.grad), _bits(w.grad)))
    # Per backward, the later Scale(t) runs first (t is the recompute's captured input: never offered), then Scale(h)
    # with h's gradient pending from the add.
    assert scale.offered == [False, True, False, True]
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_norm_functions_fold_dx_and_save_a_dispatch(norm, monkeypatch):
    """A norm reading a tensor whose gradient is pending (a residual stream): the derived Function's folded dx equals
    the engine's add bit for bit, and the backward takes one dispatch fewer."""
    x0, w = autograd.tensor(_array((7, 33), 2), requires_grad=True), autograd.tensor(_array((33,), 3) + 1.0,
                                                                                     requires_grad=True)

    def run():
        x0.grad = w.grad = None
        r = x0 * 2.0
        y = F.layer_norm(r, w, None) if norm == "layernorm" else F.rms_norm(r, w)
        loss = _loss(r + y)
        rt.sync()
        before = rt.counters()["dispatches"]
        loss.backward()
        rt.sync()
        return rt.counters()["dispatches"] - before, _bits(x0.grad), _bits(w.grad)

    folded = run()
    with monkeypatch.context() as m:
        m.setattr(Context, "pending_grad", lambda self, index: None)  # the route before folding
        plain = run()
    assert folded[0] == plain[0] - 1, (folded[0], plain[0])
    for a, b in zip(folded[1:], plain[1:], strict=True):
        np.testing.assert_array_equal(a, b)
