"""Function: one differentiable op, forward and vector-Jacobian product side by side.

Built-in ops and users' custom ops are both `Function` subclasses. `forward(ctx, *args)` receives
helios tensors (autograd Tensors unwrapped) and returns one or more helios tensors; `backward(ctx,
*grad_outputs)` returns one gradient per forward argument (None where there is none). What backward
needs is saved explicitly with `ctx.save_for_backward`, which also records each tensor's version so
that an in-place change between forward and backward is an error, not a wrong gradient.
"""

from __future__ import annotations

import itertools
from typing import Any

from autograd.grad_mode import is_grad_enabled

_sequence = itertools.count()


class _Accumulated:
    """Returned by a backward for an input whose gradient it already added into `ctx.grad_sink(i)`."""

    def __repr__(self) -> str:
        return "ACCUMULATED"


ACCUMULATED = _Accumulated()


class Folded:
    """Returned by a backward for input `index` as Folded(raw) when raw already includes `ctx.pending_grad(index)`
    (raw = its own gradient + the pending one): the engine then replaces the pending gradient with raw instead of
    adding the two, which saves the add's dispatch. raw must be a fresh tensor the backward hands over: the engine
    owns it from then on and may add later gradients into it in place."""

    __slots__ = ("raw",)

    def __init__(self, raw) -> None:
        self.raw = raw

    def __repr__(self) -> str:
        return f"Folded({self.raw!r})"


class Context:
    """What a Function's forward leaves for its backward."""

    def __init__(self, inputs: tuple, needs_input_grad: tuple[bool, ...]):
        self.inputs = inputs  # autograd Tensors (or None for non-tensor arguments), positionally
        self.needs_input_grad = needs_input_grad
        self._saved: list[tuple[Any, Any, int]] | None = []  # (raw tensor, Version or None, value at save)
        self._non_differentiable: set[int] = set()
        self._sinks: tuple = ()
        self._pending: tuple = ()  # per input: the raw gradient pending for it (set by the engine during backward)
        self.released = False

    def save_for_backward(self, *tensors) -> None:
        """Keep these tensors (inputs, outputs or intermediates of forward) for backward."""
        from autograd.tensors import Tensor

        for t in tensors:
            if isinstance(t, Tensor):
                self._saved.append((t.data, t._version, t._version.value))
                continue
            owner = next((inp for inp in self.inputs if isinstance(inp, Tensor) and inp.operand is t), None)
            if owner is not None:
                self._saved.append((t, owner._version, owner._version.value))
            else:
                self._saved.append((t, None, 0))  # an output or intermediate: linked to its Version in apply

    @property
    def saved_tensors(self) -> tuple:
        if self._saved is None:
            raise RuntimeError(
                "Trying to backward through the graph a second time (or to read saved tensors after they were "
                "freed). Pass retain_graph=True to the first backward() if you need to backward twice."
            )
        for raw, version, value in self._saved:
            if version is not None and version.value != value:
                raise RuntimeError(
                    f"A tensor of shape {tuple(raw.shape) if raw is not None else None} needed for gradient "
                    f"computation was modified by an in-place operation (its version is {version.value}, "
                    f"it was saved at version {value}). Clone it before modifying it, or modify a copy."
                )
        return tuple(raw for raw, _, _ in self._saved)

    def mark_non_differentiable(self, *raw_outputs) -> None:
        """Outputs that carry no gradient (saved statistics, indices)."""
        self._non_differentiable.update(id(t) for t in raw_outputs)

    def grad_sink(self, index: int):
        """The gradient buffer input `index` accumulates into, if it has one (a Parameter's arena view).

        A backward that writes its result there with `accumulate=True` returns ACCUMULATED for that input,
        which saves a separate add per parameter gradient.
        """
        return self._sinks[index] if index < len(self._sinks) else None

    def pending_grad(self, index: int):
        """The raw gradient already waiting for input `index` (the sum of what ops processed earlier in this backward
        sent it), or None: always None for leaves, for tensors `autograd.grad` captures, for a tensor given at more
        than one input index, and where nothing is pending yet. A backward that adds it into its own gradient for
        that input returns Folded(sum) there (see Folded), which saves the engine's add."""
        return self._pending[index] if index < len(self._pending) else None

    def release(self) -> None:
        self._saved = None
        self.released = True


class Node:
    """A tape entry: the Function that ran, its context, and how many outputs it made."""

    __slots__ = ("function", "ctx", "sequence", "num_outputs", "__weakref__")

    def __init__(self, function: type[Function], ctx: Context, num_outputs: int):
        self.function = function
        self.ctx = ctx
        self.sequence = next(_sequence)
        self.num_outputs = num_outputs

    @property
    def name(self) -> str:
        return self.function.__name__


class Function:
    """Base class of differentiable ops. Subclasses define static `forward` and `backward`."""

    @staticmethod
    def forward(ctx: Context, *args, **kwargs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx: Context, *grad_outputs):
        raise NotImplementedError

    @classmethod
    def apply(cls, *args, **kwargs):
        from autograd.tensors import Tensor

        inputs = tuple(a if isinstance(a, Tensor) else None for a in args)
        needs = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        record = is_grad_enabled() and any(needs)
        ctx = Context(inputs, needs)
        raw_args = [a.operand if isinstance(a, Tensor) else a for a in args]
        result = cls.forward(ctx, *raw_args, **kwargs)
        single = not isinstance(result, tuple)
        raw_outputs = (result,) if single else result
        node = Node(cls, ctx, len(raw_outputs)) if record else None
        outputs = []
        for index, raw in enumerate(raw_outputs):
            if raw is None:
                outputs.append(None)
                continue
            differentiable = record and id(raw) not in ctx._non_differentiable
            out = Tensor(raw, requires_grad=differentiable)
            if differentiable:
                out.grad_fn, out.output_index = node, index
            outputs.append(out)
        if record:
            by_id = {id(o.data): o for o in outputs if o is not None}
            ctx._saved = [
                (raw, by_id[id(raw)]._version, 0) if version is None and id(raw) in by_id else (raw, version, value)
                for raw, version, value in ctx._saved
            ]
        else:
            ctx.release()  # nothing will read what forward saved
        return outputs[0] if single else tuple(outputs)
