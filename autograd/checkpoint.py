"""Activation checkpointing: run a module's forward without keeping its activations, and recompute them
in backward from the saved input.

    y = checkpoint(block, x, rng=model.cursor)

Forward runs `block(x)` under no_grad, so nothing inside the block is saved and its intermediate
tensors go back to the pool at once; only x is kept. Backward re-runs `block(x)` with recording on,
then propagates the incoming gradient through that fresh tape: parameter gradients accumulate into
their `.grad` (the arena) exactly as in a plain backward, and x's gradient is passed on. Dropout masks
come out the same because the RNG cursor is put back where it stood when the forward ran.
"""

from __future__ import annotations

import copy

from autograd.engine import run_backward
from autograd.function import Context, Function
from autograd.grad_mode import enable_grad, is_grad_enabled, no_grad
from autograd.tensors import Tensor


def _snapshot(cursor) -> dict | None:
    """An independent copy of the cursor's state (its counters included), or None without a cursor."""
    return None if cursor is None else {k: copy.copy(v) for k, v in vars(cursor).items()}


def _restore(cursor, state: dict | None) -> None:
    if cursor is not None and state is not None:
        vars(cursor).update({k: copy.copy(v) for k, v in state.items()})


class _Checkpoint(Function):
    @staticmethod
    def forward(ctx: Context, x, *, module, cursor):
        ctx.module, ctx.cursor, ctx.rng_state = module, cursor, _snapshot(cursor)
        ctx.save_for_backward(x)
        with no_grad():
            return module(Tensor(x)).data

    @staticmethod
    def backward(ctx: Context, grad_y):
        (x_raw,) = ctx.saved_tensors
        after_forward = _snapshot(ctx.cursor)
        _restore(ctx.cursor, ctx.rng_state)
        try:
            with enable_grad():
                x = Tensor(x_raw, requires_grad=True)
                y = ctx.module(x)
        finally:
            _restore(ctx.cursor, after_forward)
        grads = run_backward([y], [grad_y], retain_graph=False, capture=[x], accumulate_leaves=True)
        return grads.get(id(x))


def checkpoint(module, x: Tensor, rng=None) -> Tensor:
    """module(x), recomputed in backward instead of kept (see the module docstring). `rng` is the dropout
    cursor the module draws from, if any. Without recording (eval, no_grad) it is a plain call."""
    if not (is_grad_enabled() and x.requires_grad):
        return module(x)
    return _Checkpoint.apply(x, module=module, cursor=rng)
