"""Every op spec (helios.kernels.spec) tested from its one declaration: forward against the numpy reference at
awkward shapes, backward against the reference gradient, the reference gradient against float64 finite
differences, spirv-val validity of every variant, the autograd Function, and docs/OPS.md's table being current."""

from __future__ import annotations

import re

import numpy as np
import pytest

import helios.runtime as rt
from helios.kernels import optable
from helios.kernels.spec import specs
from helios.spirv import validate

SPECS = specs()


@pytest.mark.parametrize("kernel,variant", [(k, v) for s in SPECS for k in s.kernels for v in k.variants],
                         ids=lambda x: getattr(x, "name", x))
def test_spirv_valid(kernel, variant):
    validate(kernel.module(variant).words)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_forward_and_backward_against_reference(spec, access):
    rng = np.random.default_rng(0)
    for shape in spec.shapes:
        x = spec.inputs(rng, shape)
        x64 = x.astype(np.float64)
        y = spec.forward(rt.from_numpy(x))
        np.testing.assert_allclose(y.numpy(), spec.reference(x64), rtol=1e-5, atol=1e-6)
        dy = rng.standard_normal(shape).astype(np.float32)
        saved = rt.from_numpy(x) if spec.saves == "x" else y
        saved64 = x64 if spec.saves == "x" else spec.reference(x64)
        dx = spec.backward(saved, rt.from_numpy(dy)).numpy()
        np.testing.assert_allclose(dx, dy * spec.reference_grad(saved64), rtol=2e-5, atol=1e-5)  # |dy| ~ 3


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_reference_gradient_matches_finite_differences(spec):
    x = spec.inputs(np.random.default_rng(1), (64,)).astype(np.float64)
    x = x[np.abs(x) > 1e-2]  # away from relu's kink
    h = 1e-6
    numeric = (spec.reference(x + h) - spec.reference(x - h)) / (2 * h)
    saved = x if spec.saves == "x" else spec.reference(x)
    np.testing.assert_allclose(spec.reference_grad(saved), numeric, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_autograd_function_and_functional(spec):
    import autograd
    import autograd.functional as F

    x = spec.inputs(np.random.default_rng(2), (7, 33))
    t = autograd.tensor(x, requires_grad=True)
    getattr(F, spec.name)(t).sum(axis=None).backward()
    saved = x.astype(np.float64) if spec.saves == "x" else spec.reference(x.astype(np.float64))
    np.testing.assert_allclose(t.grad.numpy(), spec.reference_grad(saved), rtol=2e-5, atol=1e-6)


def test_helios_ops_exports_every_spec():
    from helios import ops

    for s in SPECS:
        assert getattr(ops, s.name) is s.forward and getattr(ops, f"{s.name}_backward") is s.backward
        assert s.name in ops.__all__


def test_helios_ops_finds_every_declared_op():
    """helios.ops reads each kernel file's OPS tuple from its source: every name resolves to a function of that
    file, and a file's public op function that it forgot to declare would be missed (docs/OPS.md names it)."""
    from helios import ops

    declared = ops._declared()
    assert {"matmul", "flash_attention", "layernorm", "cast", "loss_scale_update", "sum", "adamw_step"} <= set(declared)
    for name, module in declared.items():
        fn = getattr(ops, name)
        assert callable(fn) and fn.__module__ == module, (name, module, fn)
    doc = optable.DOC.read_text()
    for name in declared:
        assert f"`{name}(" in doc or f"`{name}`" in doc, f"docs/OPS.md does not document helios.ops.{name}"
    documented = set(re.findall(r"^\| `([a-z_0-9]+)\(", doc, re.M))  # each table row's first op function
    assert documented and documented <= set(ops.__all__), f"documented but not found: {documented - set(ops.__all__)}"
    with pytest.raises(AttributeError, match="docs/OPS.md"):
        ops.no_such_op  # noqa: B018


def test_ops_table_is_current():
    assert optable.DOC.read_text() == optable.render(optable.DOC.read_text()), \
        "docs/OPS.md's op table is stale: run python -m helios.kernels.optable"


def test_bench_has_every_spec():
    from helios.bench import elementwise

    names = {r["kernel"] for r in elementwise._records(1 << 10, 1, None)}
    assert {n for s in SPECS for n in (s.name, f"{s.name}_backward")} <= names
