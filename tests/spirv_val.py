"""The spirv-valid cases' batch: every test_spirv_valid case takes the `spirv_val` fixture and is parametrized by
(kernel, variant); on first use the fixture builds the modules of all the session's selected cases and checks the
distinct ones with batched spirv-val runs (helios.spirv.tools.verdicts), so each case reads a verdict."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest

from helios.errors import HeliosError
from helios.spirv import Kernel, validate
from helios.spirv.tools import verdicts


def spirv_cases(kernels: Iterable[Kernel], variants: Sequence[str] | None = None) -> list:
    """pytest params "kernel,variant" for each kernel's variants (or the given ones), with ids kernel-variant."""
    return [pytest.param(k, v, id=f"{k.name}-{v}") for k in kernels for v in (variants or k.variants)]


class SessionSpirvVal:
    """Verdicts for the spirv-valid cases of one test session, checked together on construction."""

    def __init__(self, items: Iterable[pytest.Item]) -> None:
        modules = []
        for item in items:
            params = getattr(item, "callspec", None)
            kernel = params.params.get("kernel") if params else None
            if "spirv_val" in getattr(item, "fixturenames", ()) and isinstance(kernel, Kernel):
                try:
                    modules.append(kernel.module(params.params.get("variant")))
                except HeliosError:
                    pass  # a module that does not build fails its own case, with its own message
        verdicts(modules)

    def check(self, kernel: Kernel, variant: str | None) -> None:
        """Raise SpirvValidationError (spirv-val's message) if the variant's module is invalid."""
        validate(kernel.module(variant))
