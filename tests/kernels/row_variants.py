"""Forcing the row kernels' (helios.kernels.rows) layout, width and register tier in tests."""

from __future__ import annotations

import pytest

from helios.kernels import rows as RW


def force_variant(monkeypatch, layout: str, width: str, cache: int | None = None) -> None:
    """Force the row layout, width ("scalar", "vec4" or "u64x2") and register tier of the row kernels."""
    monkeypatch.setattr(RW, "LAYOUT", layout)
    monkeypatch.setattr(RW, "VEC", 1 if width == "scalar" else 4)
    monkeypatch.setattr(RW, "WIDE", width == "u64x2")
    monkeypatch.setattr(RW, "CACHE", cache)


def layout_fixture(layouts: list[tuple]):
    """A `layout` fixture running each test once per (layout, width[, register tier]) in `layouts` (rows that do
    not fit the tier stream; no tier: the kernels pick). Assign it to a module-level name `layout`."""

    @pytest.fixture(params=layouts, ids=lambda p: "-".join((p[0], p[1], *(f"reg{c}" for c in p[2:]))))
    def layout(request, monkeypatch):
        force_variant(monkeypatch, *request.param)
        return request.param

    return layout
