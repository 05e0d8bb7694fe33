"""The kernels, in packages by kind (docs/OPS.md, "Layout"):

- contract/: what every family declares into (op specs, tolerances, selection rules, dtypes, op functions);
- lib/: SPIR-V machinery more than one family shares (elementwise maps, row workers, wide access, RNG);
- the families, one file each, grouped: pointwise/, rows/, indexing/, optim/; attention/ and matmul/ are packages
  whose __init__ is the op and its spec, with a module per kernel group.

Each family file holds its numpy reference, SPIR-V builders, variants, grids and op functions."""

from __future__ import annotations


def discover(errors: list[tuple[str, BaseException]] | None = None) -> list[str]:
    """Import every kernel module, in every subpackage (so its kernels, op specs, op functions and selection rules
    register); return their names. The discovery hook of every registry that kernel modules declare into
    (helios.registry).

    A module that fails to import raises, unless `errors` is given: then (module name, exception) is
    appended to it and discovery goes on (the `python -m helios.spirv` CLI reports them).
    """
    from helios.registry import import_modules, package_modules

    return import_modules(package_modules(__name__), errors)
