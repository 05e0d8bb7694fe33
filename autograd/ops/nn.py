"""Model-level ops: linear with fused epilogues, GPT-2's GELU MLP, attention, cross-entropy (matmul's, RoPE's and
embedding's Functions are derived from their op specs: autograd/ops/specs.py)."""

from __future__ import annotations

from autograd.function import ACCUMULATED, Function
from autograd.ops.reduce import param_grad
from helios import ops
from helios import runtime as rt


def _rows(t):
    """View a [..., K] tensor as [M, K] (a reshape shares the buffer)."""
    return t.reshape(-1, t.shape[-1])


class Linear(Function):
    """y = act(x @ W^T + b) (+ residual): one dispatch forward; backward dX one, dW and db one (db taken in dW's
    product where its kernel can: matmul's a_sums), and dX's and dW's products one dispatch together where they pair
    (ops.matmul_pair: CPU devices).

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
        dx_args = {"a": dy2, "b": w} if ctx.needs_input_grad[0] else None
        dx, dw, db = _param_grads(ctx, 1, 2 if ctx.has_bias else None, dy2, x2, beside=dx_args)
        return dx.reshape(*ctx.x_shape) if dx is not None else None, dw, db, dres, None


def _param_grads(ctx, w_index: int, b_index: int | None, dy2, x2, beside: dict | None = None) -> tuple:
    """(product, dW, db) of y = x2 @ W^T + b for dy2, each None where not needed (b_index None: no bias). Each goes
    into its parameter's gradient buffer where it has one (dW a beta=1 matmul epilogue, db an accumulating column
    sum), so gradient accumulation costs no extra dispatch, and is then ACCUMULATED. With both, db (dy2's column sums)
    is taken in dW's product (matmul's a_sums: one dispatch where the kernel can, the same bits as sum_rows).
    `beside`: another product's matmul arguments (the layer's input gradient), run in dW's dispatch where the two
    pair (ops.matmul_pair); its result comes first (None without `beside`)."""
    dw = db = product = None
    need_b = b_index is not None and ctx.needs_input_grad[b_index]
    b_sink = ctx.grad_sink(b_index) if need_b else None
    if need_b:
        db = b_sink if b_sink is not None else rt.empty((dy2.shape[1],))
    if ctx.needs_input_grad[w_index]:
        sink = ctx.grad_sink(w_index)
        args = {"a": dy2, "b": x2, "trans_a": True, "out": sink, "beta": 1.0 if sink is not None else 0.0,
                "a_sums": db, "a_sums_accumulate": b_sink is not None}
        if beside is not None:
            product, dw = ops.matmul_pair(beside, args)
        else:
            dw = ops.matmul(**args)
        dw = ACCUMULATED if sink is not None else dw
    elif need_b:
        ops.sum_rows(dy2, out=db, accumulate=b_sink is not None)
    if beside is not None and product is None:
        product = ops.matmul(**beside)
    return product, dw, (param_grad(ctx, b_index, db) if need_b else None)


class GeluMLP(Function):
    """y = gelu(x @ W1^T + b1) @ W2^T + b2 (+ residual), GPT-2's MLP: forward as two Linears (GELU and the stored
    pre-activation fused into the first, the residual into the second); backward one dispatch fewer, since GELU's
    derivative is taken inside the product that makes its input gradient: dpre = (dy @ W2) * gelu'(pre), matmul's
    gelu_grad epilogue (in f32 the same bits as the product then gelu_backward, which Linear twice runs). As in
    Linear, each input-gradient product shares its dispatch with the weight gradient's where they pair."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, residual=None):
        x2 = _rows(x)
        preact = rt.empty((x2.shape[0], w1.shape[0]), x2.dtype)
        h = ops.matmul(x2, w1, trans_b=True, bias=b1, gelu=True, preact_out=preact)
        y = ops.matmul(h, w2, trans_b=True, bias=b2, residual=_rows(residual) if residual is not None else None)
        ctx.has_bias, ctx.x_shape = (b1 is not None, b2 is not None), tuple(x.shape)
        ctx.save_for_backward(x2, w1, preact, h, w2)
        return y.reshape(*x.shape[:-1], w2.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x2, w1, preact, h, w2 = ctx.saved_tensors
        needs = ctx.needs_input_grad  # x, w1, b1, w2, b2, residual
        dy2 = _rows(dy)
        dres = dy if needs[5] else None
        dx = dw1 = db1 = None
        # c_fc's gradients all start from dpre
        dpre_args = {"a": dy2, "b": w2, "gelu_grad": preact} if needs[0] or needs[1] or (ctx.has_bias[0] and needs[2]) \
            else None
        dpre, dw2, db2 = _param_grads(ctx, 3, 4 if ctx.has_bias[1] else None, dy2, h, beside=dpre_args)
        if dpre is not None:
            dx, dw1, db1 = _param_grads(ctx, 1, 2 if ctx.has_bias[0] else None, dpre, x2,
                                        beside={"a": dpre, "b": w1} if needs[0] else None)
            dx = dx.reshape(*ctx.x_shape) if dx is not None else None
        return dx, dw1, db1, dw2, db2, dres


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
