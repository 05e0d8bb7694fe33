"""Every kernel's grid has the one signature grid(shape, variant); Kernel.grid_for resolves and reports."""

from __future__ import annotations

import inspect

import pytest

from helios import kernels
from helios.spirv import Kernel, SpirvError, examples, one_workgroup, registry


def _registered() -> list[Kernel]:
    kernels.discover()
    return registry.load_all()


def _build(b, v):
    b.local_size(1)


# (name, kind, default) of each parameter of grid(shape, variant)
ONE_SIGNATURE = [(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty)
                 for name in ("shape", "variant")]


def test_every_registered_grid_takes_shape_and_variant():
    found = [k for k in _registered() if k.grid is not None]
    assert len(found) > 20  # the discovery found the kernel families
    wrong = {}
    for k in found:
        params = inspect.signature(k.grid).parameters.values()
        if [(p.name, p.kind, p.default) for p in params] != ONE_SIGNATURE:
            wrong[k.name] = str(inspect.signature(k.grid))
    assert not wrong, f"grids not of the form grid(shape, variant): {wrong}"


def test_every_helios_kernel_declares_a_grid():
    modules = set(kernels.discover()) | {examples.__name__}
    missing = [k.name for k in registry.load_all() if k.build.__module__ in modules and k.grid is None]
    assert not missing, f"kernels without a grid: {missing}"


def test_grid_for_resolves_the_named_variant():
    assert examples.ADD.grid_for((1000,), "scalar") == (16, 1, 1)
    assert examples.ADD.grid_for((1000,), "vec4") == (4, 1, 1)
    assert examples.REDUCE_SUBGROUP.grid_for((65,)) == (2, 1, 1)  # its only variant


def test_grid_for_errors_name_the_kernel():
    with pytest.raises(SpirvError, match="example_add.*no variant 'vec8'.*scalar, vec4"):
        examples.ADD.grid_for((8,), "vec8")
    with pytest.raises(SpirvError, match="example_add.*name one"):
        examples.ADD.grid_for((8,))
    gridless = Kernel("test_grid_none", _build, register=False)
    with pytest.raises(SpirvError, match="'test_grid_none' declares no grid"):
        gridless.grid_for((8,))
    single = Kernel("test_grid_single", _build, grid=one_workgroup, register=False)
    assert single.grid_for(()) == (1, 1, 1)
