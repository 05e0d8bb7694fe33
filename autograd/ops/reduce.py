"""Reductions and views: forward and VJP side by side (softmax's and the norms' Functions are derived from their op
specs: autograd/ops/specs.py)."""

from __future__ import annotations

import math

from autograd.function import ACCUMULATED, Function
from helios import ops
from helios import runtime as rt


def _expand(dy, shape, axis):
    """Broadcast a reduced gradient back over the reduced axis (one fill + one broadcast add)."""
    zeros = rt.zeros(shape)
    if axis is None:
        return ops.add(zeros.reshape(-1), dy.reshape(1)).reshape(*shape)
    return ops.add(zeros, dy.reshape(*shape[:-1], 1))


def _check_axis(axis, ndim):
    if axis not in (None, -1, ndim - 1):
        raise ValueError(f"helios reduces over the last axis or everything; got axis={axis} for a {ndim}-D tensor")


class Sum(Function):
    @staticmethod
    def forward(ctx, x, axis=-1):
        _check_axis(axis, len(x.shape))
        ctx.shape, ctx.axis = tuple(x.shape), axis
        return ops.sum(x, axis=None if axis is None else -1)

    @staticmethod
    def backward(ctx, dy):
        return _expand(dy, ctx.shape, ctx.axis), None


class Mean(Function):
    @staticmethod
    def forward(ctx, x, axis=-1):
        _check_axis(axis, len(x.shape))
        ctx.shape, ctx.axis = tuple(x.shape), axis
        ctx.count = math.prod(x.shape) if axis is None else x.shape[-1]
        return ops.mean(x, axis=None if axis is None else -1)

    @staticmethod
    def backward(ctx, dy):
        return _expand(ops.scale(dy, 1.0 / ctx.count), ctx.shape, ctx.axis), None


class Reshape(Function):
    @staticmethod
    def forward(ctx, x, shape):
        ctx.shape = tuple(x.shape)
        return x.reshape(*shape)

    @staticmethod
    def backward(ctx, dy):
        return dy.reshape(*ctx.shape), None


def param_grad(ctx, index, computed):
    """ACCUMULATED when the kernel wrote into the sink, else the computed gradient (or None)."""
    if not ctx.needs_input_grad[index]:
        return None
    return ACCUMULATED if ctx.grad_sink(index) is not None else computed


class Concat(Function):
    """Join tensors along the last axis (e.g. separate q, k, v projections into a fused QKV)."""

    @staticmethod
    def forward(ctx, *parts):
        ctx.widths = [p.shape[-1] for p in parts]
        return ops.concat(list(parts))

    @staticmethod
    def backward(ctx, dy):
        grads, start = [], 0
        for width, needed in zip(ctx.widths, ctx.needs_input_grad):
            grads.append(ops.slice_columns(dy, start, start + width) if needed else None)
            start += width
        return tuple(grads)
