"""`Kernel`: a named kernel with its build function and named variants; `Variant`: one variant's
parameters. Each variant is built once, on first use, into a ShaderModule."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from helios.spirv.builder import KernelBuilder
from helios.spirv.shader import ShaderModule
from helios.spirv.types import SpirvError


def ceil_div(a: int, b: int) -> int:
    """a / b rounded up, for positive b: the workgroups that cover a items in groups of b."""
    return -(-a // b)


class Variant:
    """The parameters of one kernel variant, readable as attributes (`v.vec`); `v.name` is its name."""

    __slots__ = ("name", "params")

    def __init__(self, _name: str = "", /, **params: Any) -> None:
        object.__setattr__(self, "name", _name)
        object.__setattr__(self, "params", dict(params))

    def __getattr__(self, key: str):
        params = object.__getattribute__(self, "params")
        if key in params:
            return params[key]
        raise AttributeError(
            f"variant {object.__getattribute__(self, 'name')!r} has no parameter {key!r} "
            f"(parameters: {', '.join(params) or 'none'})"
        )

    def __setattr__(self, key, value):
        raise AttributeError("Variant is immutable")

    def get(self, key: str, default=None):
        return self.params.get(key, default)

    def named(self, name: str) -> Variant:
        return Variant(name, **self.params)

    def __eq__(self, other) -> bool:
        return isinstance(other, Variant) and (self.name, self.params) == (other.name, other.params)

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self.params.items(), key=lambda kv: kv[0]))))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"Variant({self.name!r}{', ' if args else ''}{args})"


BuildFn = Callable[[KernelBuilder, Variant], None]


def build_module(name: str, build: BuildFn, variant: Variant | None = None) -> ShaderModule:
    """Run a build function for one variant and return the finished module (no registry, no cache)."""
    variant = variant or Variant("default")
    b = KernelBuilder(name, variant.name)
    build(b, variant)
    return b.finish()


GridFn = Callable[[tuple[int, ...], Variant], tuple[int, int, int]]


def one_workgroup(shape: tuple[int, ...], variant: Variant) -> tuple[int, int, int]:
    """The grid of a kernel whose single workgroup loops over the whole problem, whatever its shape."""
    return (1, 1, 1)


class Kernel:
    """A kernel: unique name, build function, variants (name -> params), optional grid/flops/bytes
    callables and required DeviceInfo features. Registered globally on construction.

    `grid(shape, variant) -> (gx, gy, gz)`: the workgroup counts of one dispatch, from the kernel's problem
    shape (a tuple of ints each kernel documents, e.g. `(n,)`, `(rows, cols)`) and the Variant that runs."""

    def __init__(self, name: str, build: BuildFn, variants: Mapping[str, Mapping | Variant] | None = None,
                 grid: GridFn | None = None, flops: Callable | None = None, bytes: Callable | None = None,
                 requires: tuple[str, ...] | list[str] = (), register: bool = True) -> None:
        self.name = name
        self.build = build
        self.grid, self.flops, self.bytes = grid, flops, bytes
        self.requires = tuple(requires)
        variants = {"default": {}} if variants is None else variants
        if not variants:
            raise SpirvError(f"kernel {name!r} has an empty variants mapping")
        self.variants: dict[str, Variant] = {}
        for vname, params in variants.items():
            if isinstance(params, Variant):
                self.variants[vname] = params.named(vname)
            else:
                self.variants[vname] = Variant(vname, **dict(params))
        self._modules: dict[str, ShaderModule] = {}
        self._lock = threading.Lock()
        if register:
            from helios.spirv import registry

            registry.register(self)

    def variant(self, name: str | None = None) -> Variant:
        """The named variant (the only one when name is None and there is just one)."""
        if name is None:
            if len(self.variants) != 1:
                raise SpirvError(f"kernel {self.name!r} has variants {', '.join(self.variants)}: name one")
            return next(iter(self.variants.values()))
        if name not in self.variants:
            raise SpirvError(
                f"kernel {self.name!r} has no variant {name!r} (variants: {', '.join(self.variants)})"
            )
        return self.variants[name]

    def grid_for(self, shape: tuple[int, ...], variant: str | None = None) -> tuple[int, int, int]:
        """The workgroup counts of one dispatch of the named variant over `shape` (the declared grid)."""
        if self.grid is None:
            raise SpirvError(f"kernel {self.name!r} declares no grid: pass launch() a grid of its own")
        return self.grid(shape, self.variant(variant))

    def module(self, variant: str | None = None) -> ShaderModule:
        """The ShaderModule of a variant, built on first request and cached."""
        v = self.variant(variant)
        with self._lock:
            if v.name not in self._modules:
                try:
                    self._modules[v.name] = build_module(self.name, self.build, v)
                except SpirvError as exc:
                    raise type(exc)(f"building kernel {self.name}:{v.name}: {exc}") from exc
            return self._modules[v.name]

    def modules(self) -> list[ShaderModule]:
        return [self.module(name) for name in self.variants]

    def __repr__(self) -> str:
        return f"Kernel({self.name!r}, variants={list(self.variants)})"
