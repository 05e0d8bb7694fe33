"""Every op function of docs/OPS.md in one namespace: `from helios import ops; ops.gelu(x)`.

Nothing is listed here. A kernel file names its op functions next to their definitions, in a top-level
`OPS = (...)` tuple, or declares them as op specs (helios.kernels.spec). The `OPS` tuples are read from the
files' source without importing them, so importing helios stays cheap and a kernel family is only built
when something calls one of its ops.
"""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path

_KERNELS = Path(__file__).resolve().parent / "kernels"


@functools.cache
def _declared() -> dict[str, str]:
    """helios.ops name -> kernel module, from each kernel file's top-level `OPS = (...)` tuple."""
    where: dict[str, str] = {}
    for path in sorted(_KERNELS.glob("*.py")):
        source = path.read_text()
        if "\nOPS = (" not in source:
            continue
        module = f"helios.kernels.{path.stem}"
        for node in ast.parse(source, str(path)).body:
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["OPS"]:
                for name in ast.literal_eval(node.value):
                    if name in where:
                        raise ValueError(f"helios.ops: {name!r} is declared by {where[name]} and {module}")
                    where[name] = module
    return where


def _spec_ops() -> dict[str, str]:
    """Op functions declared by op specs (helios.kernels.spec): found by discovery, never listed here."""
    from helios.kernels.spec import op_functions

    return op_functions()


def __getattr__(name: str):
    if name == "__all__":
        return sorted(_declared() | _spec_ops())
    module = _declared().get(name) or _spec_ops().get(name)
    if module is None:
        raise AttributeError(f"helios.ops has no op {name!r}; the ops are listed in docs/OPS.md")
    kernels = importlib.import_module(module)
    value = getattr(kernels, "OP_NAMES", {}).get(name) or getattr(kernels, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(_declared() | _spec_ops())
