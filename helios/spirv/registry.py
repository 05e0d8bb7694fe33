"""The global kernel registry: every `Kernel` registers itself here by unique name."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from helios.spirv.types import SpirvError

if TYPE_CHECKING:
    from helios.spirv.kernel import Kernel

_KERNELS: dict[str, Kernel] = {}


def _origin(kernel: Kernel) -> str:
    build = kernel.build
    return f"{getattr(build, '__module__', '?')}.{getattr(build, '__qualname__', '?')}"


def register(kernel: Kernel) -> None:
    """Add a kernel. A name already registered is an error whoever registered it: the kernels map_kernel makes
    all build through closures of one function, so nothing but the name tells two of them apart."""
    old = _KERNELS.get(kernel.name)
    if old is not None:
        raise SpirvError(
            f"kernel name {kernel.name!r} is already registered (built by {_origin(old)}); give the kernel built "
            f"by {_origin(kernel)} another name, or pass register=False for a kernel that is not to be listed"
        )
    _KERNELS[kernel.name] = kernel


def unregister(name: str) -> None:
    _KERNELS.pop(name, None)


def all_kernels() -> list[Kernel]:
    """Registered kernels, sorted by name."""
    return [_KERNELS[k] for k in sorted(_KERNELS)]


def get(name: str) -> Kernel:
    if name not in _KERNELS:
        raise SpirvError(f"no kernel named {name!r} (registered: {', '.join(sorted(_KERNELS)) or 'none'})")
    return _KERNELS[name]


def load_all(errors: list[tuple[str, BaseException]] | None = None,
             modules: Sequence[str] = ("helios.spirv.examples",)) -> list[Kernel]:
    """Import `modules` (the DSL's examples by default; kernel packages discover their own modules, e.g.
    helios.kernels.discover) and return every registered kernel.

    A module that fails to import raises, unless `errors` is given: then (module name, exception)
    is appended to it and loading goes on (the CLI reports them).
    """
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            if errors is None:
                raise
            errors.append((name, exc))
    return all_kernels()
