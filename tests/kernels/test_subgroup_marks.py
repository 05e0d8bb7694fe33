"""Every kernel whose SPIR-V uses subgroup instructions is named by a test marked `subgroup`.

CI runs `pytest -m subgroup tests/kernels tests/autograd tests/spirv` again at subgroup sizes 4 and 16 (lavapipe's
LP_NATIVE_VECTOR_WIDTH=128 and 512): only what differs between sizes, so a subgroup kernel without a marked
test would never run at those sizes. A mark names the registered kernels its test runs:
`@pytest.mark.subgroup("softmax", "softmax_backward")` (no names: the test checks the DSL's subgroup intrinsics).
"""

from __future__ import annotations

import importlib
from functools import cache

import pytest

import tests.autograd
import tests.kernels
import tests.spirv
from helios.kernels import discover
from helios.registry import package_modules
from helios.spirv import registry

SUITES = (tests.kernels, tests.autograd, tests.spirv)
_PARAM = type(pytest.param(None))  # what pytest.param(...) gives: a parametrize value that carries marks


def _subgroup_marks(obj) -> list:
    """The `subgroup` marks of a test function or module, those on its parametrize values included."""
    marks = list(getattr(obj, "pytestmark", []))
    for mark in [m for m in marks if m.name == "parametrize"]:
        marks += [m for value in mark.args[1] if isinstance(value, _PARAM) for m in value.marks]
    return [m for m in marks if m.name == "subgroup"]


def marked_kernels() -> dict[str, list[str]]:
    """Kernel name -> the tests whose `subgroup` marks name it, over every module of SUITES."""
    named: dict[str, list[str]] = {}
    for suite in SUITES:
        for name in package_modules(suite.__name__):  # the suite's subpackages too (tests/kernels/rows/, ...)
            if not name.rsplit(".", 1)[1].startswith("test_"):
                continue
            module = importlib.import_module(name)
            tests = [(module.__name__, module)] + [(f"{module.__name__}::{n}", f) for n, f in vars(module).items()
                                                   if n.startswith("test_") and callable(f)]
            for where, obj in tests:
                for mark in _subgroup_marks(obj):
                    for kernel in mark.args:
                        named.setdefault(kernel, []).append(where)
    return named


@cache
def subgroup_kernels() -> frozenset[str]:
    """Names of the registered kernels of which some variant declares a GroupNonUniform* capability. A half
    variant ("bf16_x", "fp16_x") runs its f32 twin x's code on other storage, so only x is built (3x faster)."""
    discover()
    found = set()
    for kernel in registry.load_all():
        for variant in kernel.variants:
            if variant.partition("_")[2] in kernel.variants:
                continue
            if any(c.startswith("GroupNonUniform") for c in kernel.module(variant).capabilities):
                found.add(kernel.name)
                break
    return frozenset(found)


def test_every_subgroup_kernel_has_a_subgroup_test():
    missing = sorted(subgroup_kernels() - set(marked_kernels()))
    assert not missing, (f"kernels using subgroup instructions with no test marked subgroup: {', '.join(missing)}; "
                         "mark a test that runs each with @pytest.mark.subgroup(\"<kernel name>\")")


def test_subgroup_marks_name_registered_kernels():
    discover()
    registered = {k.name for k in registry.load_all()}
    unknown = {k: where for k, where in marked_kernels().items() if k not in registered}
    assert not unknown, f"subgroup marks name kernels that do not exist: {unknown}"


def test_the_guard_sees_marks_on_parameters():
    @pytest.mark.parametrize("x", [1, pytest.param(2, marks=pytest.mark.subgroup("softmax"))])
    def test_example(x):
        pass

    assert [m.args for m in _subgroup_marks(test_example)] == [("softmax",)]
    assert "softmax" in subgroup_kernels()
