"""Structured control flow for KernelBuilder, as context managers.

    with b.if_(cond): ...            # OpSelectionMerge + OpBranchConditional
    with b.else_(): ...              # optional; must directly follow the if_ block
    with b.for_range(lo, hi, step=1) as k: ...   # k runs lo, lo+step, ... < hi
    with b.while_(lambda: cond) as lp: ...   # cond is re-evaluated before every iteration
    with b.loop() as lp: ...         # runs until lp.break_() / lp.break_if(cond)

Every loop takes `unroll`: True asks the driver to unroll it (LoopControl Unroll), False asks it not to
(DontUnroll), None (the default) leaves the choice to the driver.

Inside any loop, `lp.break_()`, `lp.break_if(cond)`, `lp.continue_()`, `lp.continue_if(cond)` (or
`b.break_()`, `b.break_if(cond)`, `b.continue_()` for the innermost loop, including for_range).
`b.return_()` ends the invocation. Values computed inside a block are only usable inside it (SPIR-V
dominance); carry results out through `b.var(...)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from helios.spirv import grammar as g
from helios.spirv.grammar import Op
from helios.spirv.types import SpirvError, boolean, i32, u32
from helios.spirv.values import Value, literal_type

if TYPE_CHECKING:
    from helios.spirv.builder import KernelBuilder

_TERMINATORS = {Op.Branch, Op.BranchConditional, Op.Return, Op.ReturnValue, Op.Kill, Op.Unreachable}


@dataclass
class _PendingIf:
    branch: list[int]  # the OpBranchConditional's words; the last one is the false target
    merge: int


class Loop:
    """Handle of an open loop: break and continue statements."""

    def __init__(self, b: KernelBuilder, merge: int, continue_target: int) -> None:
        self.b, self.merge, self.continue_target = b, merge, continue_target

    def break_(self) -> None:
        self.b._branch(self.merge)

    def continue_(self) -> None:
        self.b._branch(self.continue_target)

    def break_if(self, cond) -> None:
        self.b._jump_if(cond, self.merge)

    def continue_if(self, cond) -> None:
        self.b._jump_if(cond, self.continue_target)


class ControlFlow:
    """Mixin: block bookkeeping and the control-flow context managers."""

    # -- blocks ----------------------------------------------------------------------------------
    def _emit(self: KernelBuilder, opcode: int, *operands) -> list[int]:
        """Append an instruction to the current block (opening an unreachable block after a jump)."""
        self._flush_if()
        if self._terminated:
            self._label(self.m.new_id())
        words = self.m.emit(self._body, opcode, *operands)
        if opcode in _TERMINATORS:
            self._terminated = True
        return words

    def _label(self: KernelBuilder, label: int) -> None:
        if not self._terminated:
            raise SpirvError("internal: a new block was started before the previous one ended")
        self.m.emit(self._body, Op.Label, label)
        self._terminated = False

    def _branch(self: KernelBuilder, target: int) -> None:
        """End the current block with a jump to target (nothing if the block already ended)."""
        self._flush_if()
        if not self._terminated:
            self._emit(Op.Branch, target)

    def _flush_if(self: KernelBuilder) -> None:
        """An if_ without else_: its merge block starts now."""
        pending, self._pending_if = self._pending_if, None
        if pending is not None:
            self._label(pending.merge)

    def _cond(self: KernelBuilder, cond) -> Value:
        if isinstance(cond, bool):
            return self.const(cond, boolean)
        if not isinstance(cond, Value) or cond.type != boolean:
            raise SpirvError(f"a condition must be a boolean Value (a comparison), got {cond!r}")
        return cond

    def _jump_if(self: KernelBuilder, cond, target: int) -> None:
        cond = self._cond(cond)
        jump, rest = self.m.new_id(), self.m.new_id()
        self._emit(Op.SelectionMerge, rest, g.SelectionControl.None_)
        self._emit(Op.BranchConditional, cond.id, jump, rest)
        self._label(jump)
        self._emit(Op.Branch, target)
        self._label(rest)

    # -- if / else -------------------------------------------------------------------------------
    @contextmanager
    def if_(self: KernelBuilder, cond) -> Iterator[None]:
        """Run the block only where cond is true."""
        cond = self._cond(cond)
        then, merge = self.m.new_id(), self.m.new_id()
        self._emit(Op.SelectionMerge, merge, g.SelectionControl.None_)
        branch = self._emit(Op.BranchConditional, cond.id, then, merge)
        self._label(then)
        yield
        self._branch(merge)
        self._pending_if = _PendingIf(branch, merge)

    @contextmanager
    def else_(self: KernelBuilder) -> Iterator[None]:
        """The other branch of the if_ block just closed."""
        pending, self._pending_if = self._pending_if, None
        if pending is None:
            raise SpirvError("else_ must directly follow an if_ block")
        other = self.m.new_id()
        pending.branch[-1] = other
        self._label(other)
        yield
        self._branch(pending.merge)
        self._label(pending.merge)

    def return_(self: KernelBuilder) -> None:
        """End this invocation (code after it in the same block is unreachable)."""
        self._emit(Op.Return)

    # -- loops -----------------------------------------------------------------------------------
    @staticmethod
    def _loop_control(unroll: bool | None) -> int:
        """The LoopControl mask of an unroll request: True Unroll, False DontUnroll, None no hint."""
        if unroll is None:
            return g.LoopControl.None_
        if not isinstance(unroll, bool):
            raise SpirvError(f"unroll must be True, False or None, got {unroll!r}")
        return g.LoopControl.Unroll if unroll else g.LoopControl.DontUnroll

    @contextmanager
    def _open_loop(self: KernelBuilder, cond_fn: Callable[[], Value] | None, unroll: bool | None,
                   step_fn: Callable[[], None] | None = None) -> Iterator[Loop]:
        control = self._loop_control(unroll)
        header, check, body, cont, merge = (self.m.new_id() for _ in range(5))
        self._branch(header)
        self._label(header)
        self._emit(Op.LoopMerge, merge, cont, control)
        self._emit(Op.Branch, check)
        self._label(check)
        if cond_fn is None:
            self._emit(Op.Branch, body)
        else:
            cond = self._cond(cond_fn())
            self._emit(Op.BranchConditional, cond.id, body, merge)
        self._label(body)
        lp = Loop(self, merge, cont)
        self._loops.append(lp)
        yield lp
        self._loops.pop()
        self._branch(cont)
        self._label(cont)
        if step_fn is not None:
            step_fn()
        self._emit(Op.Branch, header)
        self._label(merge)

    @contextmanager
    def for_range(self: KernelBuilder, start, stop, step=1, unroll: bool | None = None) -> Iterator[Value]:
        """Loop k = start, start+step, ... while k < stop (k > stop for a negative literal step).

        Bounds may be ints or Values (spec constants, push constants, ...); k has their type (u32 if
        all are Python ints and none is negative). unroll: True adds the Unroll hint, False DontUnroll
        (keeps a loop with a known trip count a loop, e.g. on lavapipe, whose compile time grows with
        unrolled bodies), None no hint. For full unrolling with Python-int indices use a Python `for`.
        """
        typed = [x.type for x in (start, stop, step) if isinstance(x, Value)]
        if typed:
            t = typed[0]
            if any(x != t for x in typed):
                raise SpirvError(f"for_range bounds have different types: {', '.join(x.name for x in typed)}")
            if not t.is_int or t.count != 1:
                raise SpirvError(f"for_range bounds must be integer scalars, got {t.name}")
        else:
            t = i32 if any(literal_type(x) == i32 for x in (start, stop, step)) else u32
        if isinstance(step, int) and step == 0:
            raise SpirvError("for_range step must not be 0")
        descending = isinstance(step, int) and step < 0
        counter = self.var(t, start)
        if descending:
            step = -step

        def cond() -> Value:
            k = counter.load()
            return k > stop if descending else k < stop

        def advance() -> None:
            k = counter.load()
            counter.store(k - step if descending else k + step)

        with self._open_loop(cond, unroll, advance):
            yield counter.load()

    @contextmanager
    def while_(self: KernelBuilder, cond_fn: Callable[[], Value], unroll: bool | None = None) -> Iterator[Loop]:
        """Loop while cond_fn() is true; cond_fn is called once to emit the test before each iteration.
        unroll as in for_range."""
        if not callable(cond_fn):
            raise SpirvError("while_ takes a function returning the condition, e.g. b.while_(lambda: k.value < n)")
        with self._open_loop(cond_fn, unroll) as lp:
            yield lp

    @contextmanager
    def loop(self: KernelBuilder, unroll: bool | None = None) -> Iterator[Loop]:
        """Loop until lp.break_() or lp.break_if(cond); unroll as in for_range."""
        with self._open_loop(None, unroll) as lp:
            yield lp

    def _innermost(self: KernelBuilder) -> Loop:
        if not self._loops:
            raise SpirvError("break/continue outside a loop")
        return self._loops[-1]

    def break_(self: KernelBuilder) -> None:
        self._innermost().break_()

    def break_if(self: KernelBuilder, cond) -> None:
        self._innermost().break_if(cond)

    def continue_(self: KernelBuilder) -> None:
        self._innermost().continue_()

    def continue_if(self: KernelBuilder, cond) -> None:
        self._innermost().continue_if(cond)
