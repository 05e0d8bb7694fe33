"""Op specs: one declaration per op gives its kernels, variant-selection family, op functions, numpy reference
and VJP, input generator, awkward test shapes, tolerances and FLOP/byte counts; tests, autograd Functions, the
helios.ops namespace, bench entries and docs/OPS.md's table are derived from the registry (`specs()`), not
written again.

An op maps named tensor arguments (`args`: x, or x, w, b) to named results (`outputs`: y, or y, mean, rstd;
only the first takes a gradient). Its backward takes the tensors named by `saves` (any of args and outputs)
and dy, and returns one gradient per argument (dx, dw, db); the numpy reference and reference_backward take
and return the same, on float64 arrays. A pointwise op with its backward is one `pointwise(...)` call in one
kernel file; a row op (softmax, norms) is one `register(OpSpec(...))` next to its op functions (docs/OPS.md
has both worked examples). Kernel discovery (importing every kernel module so that its specs register) is
helios.kernels.discover, not the SPIR-V layer's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from helios.kernels import discover
from helios.spirv import Kernel

AWKWARD_SHAPES = ((1,), (7,), (33, 513), (1, 4097), (33, 12))
# Row ops: rows 1, 7, 33 of lengths 1 ... 4097 (odd, 4k + 1, a multiple of 4), and a 3-D input.
ROW_SHAPES = tuple((r, c) for r in (1, 7, 33) for c in (1, 7, 8, 33, 513, 4097) if r * c <= 40_000) + ((2, 3, 33),)


def normal_inputs(rng: np.random.Generator, shape) -> np.ndarray:
    """Standard normal scaled by 3, float32: the default input generator."""
    return (rng.standard_normal(shape) * 3.0).astype(np.float32)


def element_count(shape) -> tuple[int]:
    """What an elementwise kernel's flops and bytes take: (n,)."""
    return (math.prod(shape),)


def rows_and_cols(shape) -> tuple[int, int]:
    """What a row kernel's flops and bytes take: (rows, cols) over the last axis."""
    return math.prod(shape[:-1]), shape[-1]


@dataclass(frozen=True)
class Tolerance:
    """How close a kernel result must be to the float64 reference: rtol, and atol absolute or, with `floor`,
    relative to max |reference| (never below floor) for results whose scale varies with the shape."""

    rtol: float = 0.0
    atol: float = 0.0
    floor: float | None = None

    def check(self, got: np.ndarray, want: np.ndarray, what: str = "") -> None:
        atol = self.atol if self.floor is None else self.atol * max(self.floor, float(np.abs(want).max(initial=0)))
        np.testing.assert_allclose(got, want, rtol=self.rtol, atol=atol, err_msg=what)


POINTWISE_TOLERANCE = {"y": Tolerance(rtol=1e-5, atol=1e-6), "dx": Tolerance(rtol=2e-5, atol=1e-5)}  # |dy| ~ 3


def as_tuple(value) -> tuple:
    """A single result as a 1-tuple; a tuple of results as is."""
    return value if isinstance(value, tuple) else (value,)


@dataclass(frozen=True)
class OpSpec:
    """One op: forward and VJP together, with everything tests, autograd, bench and docs need."""

    name: str
    doc: str
    module: str                          # the kernel file that declares it
    kernels: tuple[Kernel, ...]          # forward kernel, then backward kernel(s)
    forward: Callable                    # helios op function: forward(*args) -> y or (y, *statistics)
    backward: Callable | None            # backward(*saved, dy) -> dx, or (dx, dw, ...): one per arg
    reference: Callable                  # numpy forward(*args), float64-capable, same results
    reference_backward: Callable | None  # numpy backward(*saved, dy), same gradients
    inputs: Callable                     # (rng, shape) -> one float32 array per arg, in the op's domain
    args: tuple[str, ...] = ("x",)       # forward's tensor arguments
    outputs: tuple[str, ...] = ("y",)    # forward's results; the first is the differentiable one
    saves: tuple[str, ...] = ("x",)      # what backward takes before dy, by name (args and outputs)
    family: str = "elementwise"          # the helios.kernels.selection family that picks the variants
    shapes: tuple = AWKWARD_SHAPES       # the kernel tests' shapes (1, 7, 33 x 513, ...)
    sizes: Callable = element_count      # shape -> the arguments of the kernels' flops and bytes
    tolerance: Mapping[str, Tolerance] = field(default_factory=lambda: POINTWISE_TOLERANCE, compare=False)
    # ^ per output and gradient name (y, mean, dx, dw, ...)
    autograd: bool = True                # autograd derives its Function (False: it has a hand-written one)

    @property
    def grads(self) -> tuple[str, ...]:
        """The gradients backward returns: d + each argument's name."""
        return tuple(f"d{a}" for a in self.args)

    def saved(self, args, outputs) -> list:
        """What backward takes before dy, picked by name from forward's arguments and results."""
        named = dict(zip(self.args, args, strict=True)) | dict(zip(self.outputs, as_tuple(outputs), strict=True))
        return [named[n] for n in self.saves]

    def flops(self, shape, kernel: int = 0) -> int:
        """FLOPs of the forward (kernel=1: the backward) on an input of `shape`."""
        return self.kernels[kernel].flops(*self.sizes(shape))

    def bytes(self, shape, kernel: int = 0) -> int:
        """Bytes the forward (kernel=1: the backward) moves on an input of `shape`."""
        return self.kernels[kernel].bytes(*self.sizes(shape))


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


def specs(family: str | None = None) -> list[OpSpec]:
    """Every registered op spec (of one selection family, if given), in name order (after discovery)."""
    discover()
    return [_REGISTRY[k] for k in sorted(_REGISTRY) if family in (None, _REGISTRY[k].family)]


def op_functions() -> dict[str, str]:
    """helios.ops name -> declaring module, for every spec's forward and backward op function."""
    discover()
    out = {}
    for s in _REGISTRY.values():
        out[s.name] = s.module
        if s.backward is not None:
            out[f"{s.name}_backward"] = s.module
    return out
