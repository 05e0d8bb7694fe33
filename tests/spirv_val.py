"""The spirv-valid cases' batch: every test_spirv_valid case takes the `spirv_val` fixture and is parametrized by
(kernel, variant); a kernel's first case builds the modules of all of that kernel's selected cases and checks the
distinct ones in one batched spirv-val run (helios.spirv.tools.verdicts), so each case reads a verdict, and that the
device contract knows every capability and extension the module declares. Per kernel,
not per session: a pytest-xdist worker builds only the modules of the kernels whose cases it runs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest

from helios.errors import HeliosError
from helios.runtime.contract import CAPABILITIES, EXTENSIONS
from helios.spirv import Kernel, validate
from helios.spirv.tools import verdicts


def spirv_cases(kernels: Iterable[Kernel], variants: Sequence[str] | None = None) -> list:
    """pytest params "kernel,variant" for each kernel's variants (or the given ones), with ids kernel-variant."""
    return [pytest.param(k, v, id=f"{k.name}-{v}") for k in kernels for v in (variants or k.variants)]


class SessionSpirvVal:
    """Verdicts for the spirv-valid cases of one test session, checked a kernel at a time."""

    def __init__(self, items: Iterable[pytest.Item]) -> None:
        self._selected: dict[Kernel, list[str | None]] = {}
        for item in items:
            params = getattr(item, "callspec", None)
            kernel = params.params.get("kernel") if params else None
            if "spirv_val" in getattr(item, "fixturenames", ()) and isinstance(kernel, Kernel):
                self._selected.setdefault(kernel, []).append(params.params.get("variant"))

    def check(self, kernel: Kernel, variant: str | None) -> None:
        """Raise SpirvValidationError (spirv-val's message) if the variant's module is invalid."""
        modules = []
        for v in self._selected.pop(kernel, ()):  # the kernel's first case: check all its selected variants at once
            try:
                modules.append(kernel.module(v))
            except HeliosError:
                pass  # a module that does not build fails its own case, with its own message
        verdicts(modules)
        module = kernel.module(variant)
        # The device contract refuses what it cannot check on a device: every need a kernel declares is in its table.
        unknown = (set(module.capabilities) - set(CAPABILITIES)) | (set(module.extensions) - set(EXTENSIONS))
        assert not unknown, f"{module.label} declares {sorted(unknown)}, which helios.runtime.contract cannot check"
        validate(module)
