"""Fixtures shared by the kernel tests."""

from __future__ import annotations

import pytest

from helios.kernels.contract import selection
from helios.kernels.lib import maps
from helios.kernels.pointwise import elementwise as E
from tests.conftest import needs_kernel


@pytest.fixture
def force():
    """force(family, choice): helios.kernels.contract.selection.force for this test only (restored after it)."""
    saved: dict = {}

    def force_choice(family: str, choice) -> None:
        saved.setdefault(family, selection.forced(family))
        selection.force(family, choice)

    yield force_choice
    for family, before in saved.items():
        selection.force(family, before)


@pytest.fixture(params=maps.ACCESSES)
def access(request, force):
    """Run the test with each elementwise access variant forced (scalar, vec4 with a scalar tail, u64x2 where
    n % 4 == 0); skipped where the device contract refuses the variant (u64x2 without shaderInt64)."""
    needs_kernel(E.ADD, request.param)
    force("elementwise", request.param)
    return request.param
