"""Model-level ops: linear with fused epilogues, attention, cross-entropy (matmul's, RoPE's and embedding's Functions
are derived from their op specs: autograd/ops/specs.py)."""

from __future__ import annotations

from autograd.function import ACCUMULATED, Function
from autograd.ops.reduce import param_grad
from helios import ops
from helios import runtime as rt


def _rows(t):
    """View a [..., K] tensor as [M, K] (a reshape shares the buffer)."""
    return t.reshape(-1, t.shape[-1])


class Linear(Function):
    """y = act(x @ W^T + b) (+ residual): one dispatch forward; dX, dW, db one dispatch each backward.

    Weight and bias gradients are accumulated straight into the parameters' gradient buffers
    (a beta=1 matmul epilogue), so gradient accumulation costs no extra dispatch.
    """

    @staticmethod
    def forward(ctx, x, w, b=None, residual=None, gelu: bool = False):
        x2 = _rows(x)
        res2 = _rows(residual) if residual is not None else None
        preact = rt.empty((x2.shape[0], w.shape[0]), x2.dtype) if gelu else None
        y = ops.matmul(x2, w, trans_b=True, bias=b, gelu=gelu, residual=res2, preact_out=preact)
        ctx.gelu, ctx.has_bias, ctx.x_shape = gelu, b is not None, tuple(x.shape)
        ctx.save_for_backward(x2, w, preact)
        return y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x2, w, preact = ctx.saved_tensors
        dy2 = _rows(dy)
        dres = dy if ctx.needs_input_grad[3] else None
        if ctx.gelu:
            dy2 = ops.gelu_backward(preact, dy2)
        dx = ops.matmul(dy2, w).reshape(*ctx.x_shape) if ctx.needs_input_grad[0] else None
        dw = db = None
        if ctx.needs_input_grad[1]:
            sink = ctx.grad_sink(1)
            dw = ops.matmul(dy2, x2, trans_a=True, out=sink, beta=1.0 if sink is not None else 0.0)
            dw = ACCUMULATED if sink is not None else dw
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = param_grad(ctx, 2, ops.sum_rows(dy2, out=ctx.grad_sink(2), accumulate=ctx.grad_sink(2) is not None))
        return dx, dw, db, dres, None




class FlashAttention(Function):
    """Causal attention read in place from fused QKV; the T x T matrix never exists. Hand-written, not derived
    from the flash_attention op spec: `counter` (a captured step's RNG counter tensor) is neither a differentiable
    argument nor a scalar, and both passes take it."""

    @staticmethod
    def forward(ctx, qkv, B, T, n_head, n_kv_head, head_dim, softcap=0.0, dropout_p=0.0, seed=0, offset=0,
                counter=None):
        ctx.args = (B, T, n_head, n_kv_head, head_dim)
        ctx.kw = dict(causal=True, softcap=softcap, dropout_p=dropout_p, seed=seed, offset=offset, counter=counter)
        o, lse = ops.flash_attention(qkv, *ctx.args, **ctx.kw)
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(qkv, o, lse)
        return o

    @staticmethod
    def backward(ctx, do):
        qkv, o, lse = ctx.saved_tensors
        dqkv = ops.flash_attention_backward(qkv, o, lse, do, *ctx.args, **ctx.kw)
        return (dqkv,) + (None,) * 10


class CrossEntropy(Function):
    """Mean cross-entropy over non-ignored rows; dlogits computed on the device in the forward pass. Hand-written
    around the cross_entropy spec's op functions: a unit loss gradient (the usual loss.backward()) costs no
    backward dispatch, which the derived Function would spend."""

    @staticmethod
    def forward(ctx, logits, targets, ignore_index: int = -1):
        shape = tuple(logits.shape)
        loss, dlogits = ops.cross_entropy(_rows(logits), targets.reshape(-1), ignore_index=ignore_index)
        ctx.save_for_backward(dlogits.reshape(*shape))  # released with the graph, so memory falls in backward
        return loss

    @staticmethod
    def backward(ctx, dloss):
        from autograd.engine import is_unit_seed

        (dlogits,) = ctx.saved_tensors
        if not is_unit_seed(dloss):  # scale by the incoming gradient on the device: no host read
            dlogits = ops.cross_entropy_backward(dlogits, dloss)
        return dlogits, None, None
