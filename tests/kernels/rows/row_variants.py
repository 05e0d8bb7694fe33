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


# Half dtypes of a norm backward test at one choice per storage width (scalar, vec4, u64x2; streaming and a register
# tier): what differs between half and f32 there is the storage, which only the width selects; f32 at every forced
# choice.
_NORM_HALF_CHOICES = {("sg", "scalar", 0), ("sg", "vec4", 0), ("sg", "u64x2", 4)}


def norm_backward_cases(layouts: tuple[str, ...] = ("sg", "wg")) -> list:
    """pytest params (choice, dtype) of the rows rule's forced choices of `layouts` for the norm backwards' tests,
    marked to run again at subgroup sizes 4 and 16 where the rule's subgroup cases (f32) name them."""
    from helios.kernels.contract import selection

    rule = selection.declared("rows")
    subgroup = {s.choice for s in rule.subgroup if not s.ops}
    cases = []
    for choice in rule.forced:
        if choice.layout not in layouts:
            continue
        for dtype in ("f32", "bf16", "fp16") if tuple(choice) in _NORM_HALF_CHOICES else ("f32",):
            marks = [pytest.mark.needs(dtype=dtype)] if dtype != "f32" else []
            if dtype == "f32" and choice in subgroup:
                marks.append(pytest.mark.subgroup("layernorm_backward", "rmsnorm_backward"))
            cases.append(pytest.param(choice, dtype, marks=marks, id=f"{layout_id(choice)}-{dtype}"))
    return cases
