"""Elementwise ops: forward and vector-Jacobian product side by side, each calling helios kernels."""

from __future__ import annotations

from autograd.function import Context, Function
from helios import ops


def broadcast_kind(a, b) -> str:
    """How `b` lines up with `a`: "same", "row" ([N] over [..., N]) or "col" ([..., 1] over [..., N])."""
    if tuple(b.shape) == tuple(a.shape):
        return "same"
    if len(b.shape) == 1 and b.shape[0] == a.shape[-1]:
        return "row"
    if tuple(b.shape) == tuple(a.shape[:-1]) + (1,):
        return "col"
    raise ValueError(
        f"cannot broadcast shape {tuple(b.shape)} over {tuple(a.shape)}: helios broadcasts only an equal shape, "
        f"a row vector [{a.shape[-1]}] or a column {tuple(a.shape[:-1]) + (1,)}"
    )


def reduce_to(grad, kind: str, shape):
    """Sum a full-shape gradient down to the shape of a broadcast operand."""
    if kind == "same":
        return grad
    if kind == "row":
        return ops.sum_rows(grad.reshape(-1, grad.shape[-1]))
    return ops.sum(grad, axis=-1).reshape(*shape)


def broadcast_forward(ctx: Context, op, a, b, save: bool = False):
    """op(a, b), noting how b broadcasts (for reduce_to in the VJP) and saving (a, b) when the VJP needs them."""
    ctx.kind, ctx.b_shape = broadcast_kind(a, b), tuple(b.shape)
    if save:
        ctx.save_for_backward(a, b)
    return op(a, b)


class Add(Function):
    @staticmethod
    def forward(ctx: Context, a, b):
        return broadcast_forward(ctx, ops.add, a, b)

    @staticmethod
    def backward(ctx, dy):
        db = reduce_to(dy, ctx.kind, ctx.b_shape) if ctx.needs_input_grad[1] else None
        return dy, db


class Sub(Function):
    @staticmethod
    def forward(ctx, a, b):
        return broadcast_forward(ctx, ops.sub, a, b)

    @staticmethod
    def backward(ctx, dy):
        db = ops.neg(reduce_to(dy, ctx.kind, ctx.b_shape)) if ctx.needs_input_grad[1] else None
        return dy, db


def product_op(name: str, da, db) -> type[Function]:
    """The Function of helios.ops.<name>, a broadcasting binary op whose VJP needs both inputs: da(a, b, dy) for a,
    db(a, b, dy) summed down to b's shape for b, each computed only when its input needs it."""

    def forward(ctx, a, b):
        return broadcast_forward(ctx, getattr(ops, name), a, b, save=True)

    def backward(ctx, dy):
        a, b = ctx.saved_tensors
        return (da(a, b, dy) if ctx.needs_input_grad[0] else None,
                reduce_to(db(a, b, dy), ctx.kind, ctx.b_shape) if ctx.needs_input_grad[1] else None)

    return type(name.capitalize(), (Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward),
                                                 "__module__": __name__})


Mul = product_op("mul", lambda a, b, dy: ops.mul(dy, b), lambda a, b, dy: ops.mul(dy, a))
Div = product_op("div", lambda a, b, dy: ops.div(dy, b),
                 lambda a, b, dy: ops.neg(ops.div(ops.div(ops.mul(dy, a), b), b)))  # d(a/b)/db = -a/b^2


class Scale(Function):
    @staticmethod
    def forward(ctx, x, s: float):
        ctx.s = s
        return ops.scale(x, s)

    @staticmethod
    def backward(ctx, dy):
        return ops.scale(dy, ctx.s), None


class Neg(Function):
    @staticmethod
    def forward(ctx, x):
        return ops.neg(x)

    @staticmethod
    def backward(ctx, dy):
        return ops.neg(dy)


class Clone(Function):
    @staticmethod
    def forward(ctx, x):
        return ops.clone(x)

    @staticmethod
    def backward(ctx, dy):
        return dy


class MaskedFill(Function):
    @staticmethod
    def forward(ctx, x, mask, value: float):
        ctx.save_for_backward(mask)
        return ops.masked_fill(x, mask, value)

    @staticmethod
    def backward(ctx, dy):
        (mask,) = ctx.saved_tensors
        return ops.masked_fill(dy, mask, 0.0), None, None


class SwiGLU(Function):
    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return ops.swiglu(gate, up)

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        return ops.swiglu_backward(gate, up, dy)


class Dropout(Function):
    @staticmethod
    def forward(ctx, x, p: float, seed: int, offset: int, counter=None):
        ctx.args = (p, seed, offset, counter)
        return ops.dropout(x, *ctx.args)

    @staticmethod
    def backward(ctx, dy):
        return ops.dropout_backward(dy, *ctx.args), None, None, None, None


class ResidualDropoutAdd(Function):
    @staticmethod
    def forward(ctx, x, y, p: float, seed: int, offset: int, counter=None):
        ctx.args = (p, seed, offset, counter)
        return ops.residual_dropout_add(x, y, *ctx.args)

    @staticmethod
    def backward(ctx, dout):
        dy = ops.residual_dropout_add_backward(dout, *ctx.args) if ctx.needs_input_grad[1] else None
        return dout, dy, None, None, None, None
