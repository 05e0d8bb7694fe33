"""Forcing the row kernels' (helios.kernels.lib.row_workers) layout, width and register tier in tests."""

from __future__ import annotations

import pytest

from helios.kernels.lib.row_workers import RowChoice
from tests.conftest import needs_kernel


def force_variant(force, layout: str, width: str, cache: int | None = None, runs=()) -> None:
    """Force the row layout, width ("scalar", "vec4" or "u64x2") and register tier of the row kernels
    (`force` is the kernel tests' fixture of that name). The test is skipped where the device contract refuses
    that variant of a kernel in `runs` (the row kernels it launches: u64x2 needs shaderInt64)."""
    for kernel in runs:
        needs_kernel(kernel, "_".join((layout, width, *([f"reg{cache}"] if cache else []))))
    force("rows", RowChoice(layout, width, cache))


def layout_id(layout: tuple) -> str:
    """A test id for a (layout, width[, register tier]): "sg-vec4-reg4"."""
    return "-".join((layout[0], layout[1], *(f"reg{c}" for c in layout[2:])))


def layout_fixture(layouts: list[tuple]):
    """A `layout` fixture running each test once per (layout, width[, register tier]) in `layouts` (rows that do
    not fit the tier stream; no tier: the kernels pick). Assign it to a module-level name `layout`."""

    @pytest.fixture(params=layouts, ids=layout_id)
    def layout(request, force):
        force_variant(force, *request.param)
        return request.param

    return layout
