"""The registry of op functions that helios/ops.py is generated from (tools/gen_ops.py): a kernel file declares
its op functions here at import (elementwise.py's `OPS = declare_ops(__name__, clone)`), or declares them as op
specs (helios.kernels.contract.spec, whose `register` declares the spec's forward and backward here). Kernel modules
import this, never helios.ops, so the kernels do not depend on the namespace that serves them."""

from __future__ import annotations

from collections.abc import Callable

from helios.kernels import discover
from helios.registry import Registry

OPS: Registry[Callable] = Registry("op", discover=discover)


def declare_ops(module: str, *functions: Callable, **named: Callable) -> tuple[str, ...]:
    """Declare `module`'s op functions: each of `functions` under its own name, each of `named` under its key
    (reduce's `sum=reduce_sum`). Returns the declared names; a name declared twice is an error."""
    entries = {fn.__name__: fn for fn in functions} | named
    for name, fn in entries.items():
        OPS.add(name, fn, module)
    return tuple(entries)


def declared() -> dict[str, str]:
    """helios.ops name -> the module that declares it, for every op (after discovery)."""
    return {name: OPS.declared_by(name) for name in OPS.names()}
