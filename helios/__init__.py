"""helios: GPT training on Vulkan compute, with SPIR-V built in Python.

The runtime's everyday names are importable from here (`helios.from_numpy`, `helios.launch`, ...). They are
loaded on first use, so `import helios` stays cheap and needs no Vulkan loader (`python -m helios info`
reports a missing one cleanly).
"""

from __future__ import annotations

_EXPORTS = {
    "Tensor": "helios.runtime.tensor",
    "empty": "helios.runtime.tensor",
    "zeros": "helios.runtime.tensor",
    "full": "helios.runtime.tensor",
    "from_numpy": "helios.runtime.tensor",
    "fill": "helios.runtime.tensor",
    "copy": "helios.runtime.tensor",
    "launch": "helios.runtime.context",
    "sync": "helios.runtime.context",
    "counters": "helios.runtime.context",
    "reset_counters": "helios.runtime.context",
    "configure": "helios.runtime.context",
    "timed": "helios.runtime.timing",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'helios' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
