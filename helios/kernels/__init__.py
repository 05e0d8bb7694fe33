"""The op families (one file each; attention and matmul a front file and a file per kernel group): numpy
references, SPIR-V builders, variants, grids, op functions; and the host-side modules they share."""

from __future__ import annotations


def discover(errors: list[tuple[str, BaseException]] | None = None) -> list[str]:
    """Import every kernel module (so its kernels, op specs, op functions and selection rules register); return
    their names. The discovery hook of every registry that kernel modules declare into (helios.registry).

    A module that fails to import raises, unless `errors` is given: then (module name, exception) is
    appended to it and discovery goes on (the `python -m helios.spirv` CLI reports them).
    """
    from helios.registry import import_modules, package_modules

    return import_modules(package_modules(__name__), errors)
