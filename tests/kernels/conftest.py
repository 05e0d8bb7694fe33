"""Fixtures shared by the kernel tests."""

from __future__ import annotations

import pytest

from helios.kernels import elementwise as E


@pytest.fixture(params=E.ACCESSES)
def access(request, monkeypatch):
    """Run the test with each elementwise access variant forced (scalar, vec4 with a scalar tail, u64x2 where
    n % 4 == 0)."""
    monkeypatch.setattr(E, "ACCESS", request.param)
    return request.param
