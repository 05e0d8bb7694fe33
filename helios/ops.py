"""Every op function of docs/OPS.md in one namespace: `from helios import ops; ops.gelu(x)`.

Nothing is listed here. A kernel file declares its op functions at import, next to their definitions
(elementwise.py's `OPS = declare_ops(__name__, clone)`), or declares them as op specs (helios.kernels.spec, whose
`register` declares the spec's forward and backward here). The first lookup of an op not declared yet imports
every kernel module (helios.kernels.discover); importing helios or helios.ops imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable

from helios.kernels import discover
from helios.registry import Registry

_OPS: Registry[Callable] = Registry("op", discover=discover)


def declare_ops(module: str, *functions: Callable, **named: Callable) -> tuple[str, ...]:
    """Declare `module`'s op functions: each of `functions` under its own name, each of `named` under its key
    (reduce's `sum=reduce_sum`). Returns the declared names; a name declared twice is an error."""
    entries = {fn.__name__: fn for fn in functions} | named
    for name, fn in entries.items():
        _OPS.add(name, fn, module)
    return tuple(entries)


def declared() -> dict[str, str]:
    """helios.ops name -> the module that declares it, for every op (after discovery)."""
    return {name: _OPS.declared_by(name) for name in _OPS.names()}


def __getattr__(name: str):
    if name == "__all__":
        return _OPS.names()
    if name.startswith("_"):  # dunder probes (inspect, pickle) and private names are never ops
        raise AttributeError(f"module 'helios.ops' has no attribute {name!r}")
    try:
        value = _OPS.get(name)
    except ValueError:
        raise AttributeError(f"helios.ops has no op {name!r}; the ops are listed in docs/OPS.md") from None
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return _OPS.names()
