"""helios: GPT training on Vulkan compute, with SPIR-V built in Python.

The runtime's everyday names are importable from here (`helios.from_numpy`, `helios.launch`, ...): each lookup
is served by the module `__getattr__` below from helios.runtime, which the first one loads, so `import helios`
stays cheap and needs no Vulkan loader (`python -m helios info` reports a missing one cleanly). Nothing is
cached into this module's namespace (each lookup asks again; none is on a hot path).
"""

from __future__ import annotations


def __getattr__(name: str):
    """helios.X is helios.runtime.X for every name of the runtime's __all__ (derived, not listed here)."""
    import importlib
    import importlib.util

    # Dunder probes (inspect, pickle) and submodules (`from helios import env` asks here first, then imports
    # helios.env) must not load the runtime.
    if (name.startswith("__") and name != "__all__") or importlib.util.find_spec(f"helios.{name}") is not None:
        raise AttributeError(f"module 'helios' has no attribute {name!r}")

    runtime = importlib.import_module("helios.runtime")
    if name == "__all__":
        return list(runtime.__all__)
    if name not in runtime.__all__:
        raise AttributeError(f"module 'helios' has no attribute {name!r}")
    return getattr(runtime, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__getattr__("__all__")))
