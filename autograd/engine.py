"""Reverse-mode execution of the tape: no recursion, dead gradients skipped, memory freed as it goes.

The tape is the set of Nodes reachable from the roots; processing them by descending sequence number
(the order forward created them, reversed) is a valid topological order. Gradients are lazily
recorded GPU work like everything else: nothing here reads back to the host.
"""

from __future__ import annotations

from autograd.function import ACCUMULATED, Node
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

    seed_ids = {id(g) for g in root_grads} if unit_seed else set()
    _unit_seeds.update(seed_ids)
    try:
        with no_grad():
            _propagate(nodes, roots, root_grads, pending, route, None if accumulate_leaves else capture_ids,
                       retain_graph)
    finally:
        _unit_seeds.difference_update(seed_ids)
    if capture_ids is None:
        return None
    return {key: slot.raw for key, slot in captured.items()}


def _propagate(nodes, roots, root_grads, pending, route, capture_ids, retain_graph) -> None:
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
        grads = node.function.backward(ctx, *(s.raw if s is not None else None for s in slots))
        del slots
        if not isinstance(grads, tuple):
            grads = (grads,)
        if len(grads) < len(ctx.inputs):
            grads = grads + (None,) * (len(ctx.inputs) - len(grads))
        for inp, needed, grad in zip(ctx.inputs, ctx.needs_input_grad, grads):
            if needed and grad is not None and grad is not ACCUMULATED:
                route(inp, grad)
        ctx._sinks = ()
        if not retain_graph:
            ctx.release()  # saved activations go back to the pool now, so memory falls during backward
