"""Op specs: one declaration per op gives its kernels, op functions, numpy reference and gradient, input
generator, awkward test shapes and FLOP/byte counts; tests, autograd Functions, the helios.ops namespace and
docs/OPS.md's table are derived from the registry (`specs()`), not written again.

A pointwise op with its backward is one `pointwise(...)` call in one kernel file (docs/OPS.md has a worked
example). Kernel discovery (importing every kernel module so that its specs register) is
helios.kernels.discover, not the SPIR-V layer's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from helios.kernels import discover
from helios.spirv import Kernel

AWKWARD_SHAPES = ((1,), (7,), (33, 513), (1, 4097), (33, 12))


def normal_inputs(rng: np.random.Generator, shape) -> np.ndarray:
    """Standard normal scaled by 3, float32: the default input generator."""
    return (rng.standard_normal(shape) * 3.0).astype(np.float32)


@dataclass(frozen=True)
class OpSpec:
    """One op: forward and VJP together, with everything tests, autograd, bench and docs need."""

    name: str
    doc: str
    module: str                          # the kernel file that declares it
    kernels: tuple[Kernel, ...]          # forward kernel, then backward kernel(s)
    forward: Callable                    # helios op function: forward(x) -> y
    backward: Callable | None            # backward(saved, dy) -> dx
    saves: str                           # what backward takes: "x" (input) or "y" (output)
    reference: Callable                  # numpy, float64-capable
    reference_grad: Callable | None      # d op / dx as a function of the saved tensor
    inputs: Callable = normal_inputs     # (rng, shape) -> float32 array in the op's domain
    shapes: tuple = AWKWARD_SHAPES       # the kernel tests' shapes (1, 7, 33 x 513, ...)

    def flops(self, n: int) -> int:
        """FLOPs of the forward over n elements."""
        return self.kernels[0].flops(n)

    def bytes(self, n: int) -> int:
        """Bytes the forward moves over n elements."""
        return self.kernels[0].bytes(n)


_REGISTRY: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    """Add a spec to the registry; a second spec of the same name is an error."""
    if spec.name in _REGISTRY and _REGISTRY[spec.name].module != spec.module:
        raise ValueError(f"op {spec.name!r} declared twice: {_REGISTRY[spec.name].module} and {spec.module}")
    _REGISTRY[spec.name] = spec
    return spec


def spec_of(name: str) -> OpSpec:
    """The registered spec of op `name` (its module must be imported already)."""
    return _REGISTRY[name]


def specs() -> list[OpSpec]:
    """Every registered op spec, in name order (after discovery)."""
    discover()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def op_functions() -> dict[str, str]:
    """helios.ops name -> declaring module, for every spec's forward and backward op function."""
    discover()
    out = {}
    for s in _REGISTRY.values():
        out[s.name] = s.module
        if s.backward is not None:
            out[f"{s.name}_backward"] = s.module
    return out
