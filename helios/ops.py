"""Every op function of docs/OPS.md in one namespace: `from helios import ops; ops.gelu(x)`.

Nothing is listed here. A kernel file declares its op functions at import, next to their definitions, into
helios.kernels.contract.op_functions (directly with `declare_ops`, or through an op spec's `register`). The first
lookup of an op not declared yet imports every kernel module (helios.kernels.discover); importing helios or
helios.ops imports none of them.
"""

from __future__ import annotations

from helios.kernels.contract.op_functions import OPS as _OPS
from helios.kernels.contract.op_functions import declare_ops as declare_ops
from helios.kernels.contract.op_functions import declared as declared


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
