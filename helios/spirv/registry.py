"""The global kernel registry: every `Kernel` registers itself here by unique name (a helios.registry.Registry)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from helios.registry import Registry, import_modules
from helios.spirv.types import SpirvError

if TYPE_CHECKING:
    from helios.spirv.kernel import Kernel

# No discovery hook: kernel packages discover their own modules (load_all's `modules`, helios.kernels.discover).
_KERNELS: Registry[Kernel] = Registry("kernel", missing=SpirvError)


def _origin(kernel: Kernel) -> str:
    build = kernel.build
    return f"{getattr(build, '__module__', '?')}.{getattr(build, '__qualname__', '?')}"


def register(kernel: Kernel) -> None:
    """Add a kernel. A name already registered is a ValueError whoever registered it: the kernels map_kernel
    makes all build through closures of one function, so nothing but the name tells two of them apart (pass
    register=False for a kernel that is not to be listed)."""
    _KERNELS.add(kernel.name, kernel, _origin(kernel))


def unregister(name: str) -> None:
    _KERNELS.remove(name)


def all_kernels() -> list[Kernel]:
    """Registered kernels, sorted by name."""
    return _KERNELS.loaded()


def get(name: str) -> Kernel:
    """The registered kernel `name`; an unknown name is a SpirvError listing the registered ones."""
    return _KERNELS.get(name)


def load_all(errors: list[tuple[str, BaseException]] | None = None,
             modules: Sequence[str] = ("helios.spirv.examples",)) -> list[Kernel]:
    """Import `modules` (the DSL's examples by default; kernel packages discover their own modules, e.g.
    helios.kernels.discover) and return every registered kernel.

    A module that fails to import raises, unless `errors` is given: then (module name, exception)
    is appended to it and loading goes on (the CLI reports them).
    """
    import_modules(modules, errors)
    return all_kernels()
