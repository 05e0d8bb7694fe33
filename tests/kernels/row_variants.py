"""Forcing the row kernels' (helios.kernels.rows) layout, width and register tier in tests."""

from __future__ import annotations

import pytest

from helios.kernels.rows import RowChoice


def force_variant(force, layout: str, width: str, cache: int | None = None) -> None:
    """Force the row layout, width ("scalar", "vec4" or "u64x2") and register tier of the row kernels
    (`force` is the kernel tests' fixture of that name)."""
    force("rows", RowChoice(layout, width, cache))


def layout_fixture(layouts: list[tuple]):
    """A `layout` fixture running each test once per (layout, width[, register tier]) in `layouts` (rows that do
    not fit the tier stream; no tier: the kernels pick). Assign it to a module-level name `layout`."""

    @pytest.fixture(params=layouts, ids=lambda p: "-".join((p[0], p[1], *(f"reg{c}" for c in p[2:]))))
    def layout(request, force):
        force_variant(force, *request.param)
        return request.param

    return layout
