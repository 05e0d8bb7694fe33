"""One file per op family: numpy reference, SPIR-V builders, variants, grids, op functions."""

from __future__ import annotations

import pkgutil


def discover(errors: list[tuple[str, BaseException]] | None = None) -> list[str]:
    """Import every kernel module (so its kernels and op specs register); return their names.

    A module that fails to import raises, unless `errors` is given: then (module name, exception) is
    appended to it and discovery goes on (the `python -m helios.spirv` CLI reports them).
    """
    from helios.spirv.registry import load_all

    names = sorted(i.name for i in pkgutil.iter_modules(__path__, f"{__name__}."))
    load_all(errors, modules=names)
    return names
