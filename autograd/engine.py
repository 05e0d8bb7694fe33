"""Reverse-mode execution of the tape: no recursion, dead gradients skipped, memory freed as it goes.

The tape is the set of Nodes reachable from the roots; processing them by descending sequence number
(the order forward created them, reversed) is a valid topological order. Gradients are lazily
recorded GPU work like everything else: nothing here reads back to the host. A backward may fold the gradient
already pending for an input into its own (Context.pending_grad, Folded): the engine then takes the sum in place of
the pending one instead of adding them, one dispatch fewer.
"""

from __future__ import annotations

from autograd.function import ACCUMULATED, Folded, Node
from autograd.grad_mode import no_grad

_unit_seeds: set[int] = set()


def is_unit_seed(raw) -> bool:
    """True for the d(loss)=1 seed that backward() made itself, so ops can skip scaling by it."""
    return id(raw) in _unit_seeds


def _reachable(roots) -> list[Node]:
    seen: set[int] = set()
    nodes: list[Node] = []
    stack = [r.grad_fn for r in roots if r.grad_fn is not None]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)
        for inp in node.ctx.inputs:
            if inp is not None and inp.grad_fn is not None and id(inp.grad_fn) not in seen:
                stack.append(inp.grad_fn)
    nodes.sort(key=lambda n: n.sequence, reverse=True)
    return nodes


class _GradSlot:
    """One pending gradient; `owned` means the engine allocated it and may add into it in place."""

    __slots__ = ("raw", "owned")

    def __init__(self, raw):
        self.raw, self.owned = raw, False

    def add(self, raw) -> None:
        from helios import ops

        if self.owned:
            ops.add_inplace(self.raw, raw)
        else:
            self.raw, self.owned = ops.add(self.raw, raw), True


def run_backward(roots, root_grads, *, retain_graph: bool, capture=None,
                 unit_seed: bool = False, accumulate_leaves: bool = False) -> dict[int, object] | None:
    """Propagate `root_grads` from `roots` through the tape.

    Without `capture`, leaf gradients accumulate into `.grad`. With `capture` (a list of tensors), their
    gradients are returned as {id(tensor): raw gradient} and no `.grad` is touched (`autograd.grad`),
    unless `accumulate_leaves`: then other leaves still accumulate (activation checkpointing's recompute).
    """
    nodes = _reachable(roots)
    pending: dict[int, list[_GradSlot | None]] = {}
    captured: dict[int, _GradSlot] = {}
    capture_ids = {id(t) for t in capture} if capture is not None else None

    def route(tensor, raw) -> None:
        if capture_ids is not None and id(tensor) in capture_ids:
            slot = captured.get(id(tensor))
            if slot is None:
                captured[id(tensor)] = _GradSlot(raw)
            else:
                slot.add(raw)
            return
        if tensor.grad_fn is not None:
            slots = pending.setdefault(id(tensor.grad_fn), [None] * tensor.grad_fn.num_outputs)
            slot = slots[tensor.output_index]
            if slot is None:
                slots[tensor.output_index] = _GradSlot(raw)
            else:
                slot.add(raw)
        elif tensor.requires_grad and (capture_ids is None or accumulate_leaves):
            tensor._accumulate_grad(raw)

    def slot_of(tensor) -> _GradSlot | None:
        """The pending slot a gradient for `tensor` would be added into: None for leaves, captured tensors, and
        where nothing is pending yet."""
        if tensor.grad_fn is None or (capture_ids is not None and id(tensor) in capture_ids):
            return None
        slots = pending.get(id(tensor.grad_fn))
        return None if slots is None else slots[tensor.output_index]

    seed_ids = {id(g) for g in root_grads} if unit_seed else set()
    _unit_seeds.update(seed_ids)
    try:
        with no_grad():
            _propagate(nodes, roots, root_grads, pending, route, slot_of,
                       None if accumulate_leaves else capture_ids, retain_graph)
    finally:
        _unit_seeds.difference_update(seed_ids)
    if capture_ids is None:
        return None
    return {key: slot.raw for key, slot in captured.items()}


def _exposed(ctx, slot_of) -> tuple[_GradSlot | None, ...]:
    """Per input of ctx, the pending slot its backward may fold into (Context.pending_grad): None where the input
    needs no gradient, or where the same tensor is given at more than one index (each index's gradient is its own)."""
    keys = [(id(inp.grad_fn), inp.output_index) if inp is not None and inp.grad_fn is not None else None
            for inp in ctx.inputs]
    return tuple(slot_of(inp) if needed and key is not None and keys.count(key) == 1 else None
                 for inp, needed, key in zip(ctx.inputs, ctx.needs_input_grad, keys, strict=True))


def _propagate(nodes, roots, root_grads, pending, route, slot_of, capture_ids, retain_graph) -> None:
    for root, grad in zip(roots, root_grads, strict=True):
        route(root, grad)
    for node in nodes:
        slots = pending.pop(id(node), None)
        if slots is None or all(s is None for s in slots):
            continue  # no gradient reached this entry: nothing runs for it
        ctx = node.ctx
        if ctx.released:
            raise RuntimeError(
                f"Trying to backward through {node.name} a second time, after its saved tensors were freed. "
                "Pass retain_graph=True to the first backward() if you need to backward twice."
            )
        ctx._sinks = tuple(
            inp._grad_sink() if inp is not None and capture_ids is None and inp.grad_fn is None else None
            for inp in ctx.inputs
        )
        exposed = _exposed(ctx, slot_of)
        ctx._pending = tuple(s.raw if s is not None else None for s in exposed)
        grads = node.function.backward(ctx, *(s.raw if s is not None else None for s in slots))
        del slots
        if not isinstance(grads, tuple):
            grads = (grads,)
        if len(grads) < len(ctx.inputs):
            grads = grads + (None,) * (len(ctx.inputs) - len(grads))
        for inp, needed, grad, slot in zip(ctx.inputs, ctx.needs_input_grad, grads, exposed):
            if not needed or grad is None or grad is ACCUMULATED:
                continue
            if isinstance(grad, Folded):
                if slot is not None:  # the sum already holds what was pending: it takes the slot's place
                    slot.raw, slot.owned = grad.raw, True
                    continue
                grad = grad.raw  # nothing was pending, so it is the input's own gradient
            route(inp, grad)
        ctx._sinks = ctx._pending = ()
        if not retain_graph:
            ctx.release()  # saved activations go back to the pool now, so memory falls during backward
