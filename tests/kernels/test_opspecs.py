"""Every op spec (helios.kernels.spec) tested from its one declaration: forward and backward against the numpy
reference at awkward shapes in every forced variant family choice, the reference VJP against float64 finite
differences, spirv-val validity of every variant, the derived autograd Function, helios.ops, the bench entries
and docs/OPS.md's table being current."""

from __future__ import annotations

import re

import numpy as np
import pytest

import helios.runtime as rt
from helios.kernels import elementwise as E
from helios.kernels import optable
from helios.kernels.rows import RowChoice
from helios.kernels.spec import as_tuple, specs
from tests.kernels.row_variants import LAYOUTS, layout_id

SPECS = specs()
# What each selection family's tests force, one run each: elementwise accesses, row layouts x widths x tiers.
FORCED = {"elementwise": E.ACCESSES, "rows": [RowChoice(*layout) for layout in LAYOUTS]}


# Row choices CI runs again at subgroup sizes 4 and 16 (`-m subgroup`): a register tier (its fit counts subgroup
# lanes) and streaming over a subgroup for every row op, and a workgroup per row (subgroup partials merged in shared
# memory: RowLayout.reduce, the same code in every row op) for softmax, whose pipelines JIT fastest.
SUBGROUP_CHOICES = [RowChoice("sg", "u64x2", 4), RowChoice("sg", "scalar", 0)]
SUBGROUP_WG = ("softmax", RowChoice("wg", "vec4", 4))


def _id(x) -> str:
    return layout_id(x) if isinstance(x, RowChoice) else getattr(x, "name", x)


def _forced_cases() -> list:
    """(spec, forced choice) pairs; the row ops' SUBGROUP_CHOICES carry the subgroup mark."""
    return [pytest.param(s, c, marks=pytest.mark.subgroup(*(k.name for k in s.kernels)))
            if s.family == "rows" and (c in SUBGROUP_CHOICES or (s.name, c) == SUBGROUP_WG) else (s, c)
            for s in SPECS for c in FORCED[s.family]]


@pytest.mark.parametrize("kernel,variant", [(k, v) for s in SPECS for k in s.kernels for v in k.variants], ids=_id)
def test_spirv_valid(kernel, variant, spirv_val):
    spirv_val.check(kernel, variant)


@pytest.mark.parametrize("spec,choice", _forced_cases(), ids=_id)
def test_forward_and_backward_against_reference(spec, choice, force):
    force(spec.family, choice)
    rng = np.random.default_rng(0)
    for shape in spec.shapes:
        args = spec.inputs(rng, shape)
        args64 = [a.astype(np.float64) for a in args]
        want = as_tuple(spec.reference(*args64))
        got = as_tuple(spec.forward(*map(rt.from_numpy, args)))
        for name, g, w in zip(spec.outputs, got, want, strict=True):
            spec.tolerance[name].check(g.numpy(), w, f"{spec.name} {name} {shape}")
        # The backward takes the reference's saved tensors rounded to f32, so it is tested apart from the forward.
        dy = rng.standard_normal(shape).astype(np.float32)
        saved64 = spec.saved(args64, want)
        grads = as_tuple(spec.backward(*(rt.from_numpy(s.astype(np.float32)) for s in saved64), rt.from_numpy(dy)))
        want_grads = as_tuple(spec.reference_backward(*saved64, dy.astype(np.float64)))
        for name, g, w in zip(spec.grads, grads, want_grads, strict=True):
            spec.tolerance[name].check(g.numpy(), w, f"{spec.name} {name} {shape}")


@pytest.mark.parametrize("spec", SPECS, ids=_id)
def test_reference_backward_matches_finite_differences(spec):
    """Each gradient of the float64 reference VJP against central differences of <dy, reference(args)>."""
    rng = np.random.default_rng(1)
    args = [a.astype(np.float64) for a in spec.inputs(rng, (3, 7))]
    want = spec.reference(*args)
    dy = rng.standard_normal(as_tuple(want)[0].shape)
    grads = as_tuple(spec.reference_backward(*spec.saved(args, want), dy))

    def y(k: int, arg: np.ndarray) -> np.ndarray:
        return as_tuple(spec.reference(*args[:k], arg, *args[k + 1:]))[0]

    h = 1e-6
    for k, (name, arg, grad) in enumerate(zip(spec.grads, args, grads, strict=True)):
        numeric = np.zeros_like(arg)
        for i in np.ndindex(arg.shape):
            e = np.zeros_like(arg)
            e[i] = h
            numeric[i] = np.sum(dy * (y(k, arg + e) - y(k, arg - e))) / (2 * h)  # difference first: no cancellation
        np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-7, err_msg=f"{spec.name} {name}")


@pytest.mark.parametrize("spec", [s for s in SPECS if s.autograd], ids=_id)
def test_autograd_function_and_functional(spec):
    import autograd
    import autograd.functional as F

    rng = np.random.default_rng(2)
    args = spec.inputs(rng, (7, 33))
    dy = rng.standard_normal((7, 33)).astype(np.float32)
    ts = [autograd.tensor(a, requires_grad=True) for a in args]
    F.mul(getattr(F, spec.name)(*ts), autograd.tensor(dy)).sum(axis=None).backward()
    args64 = [a.astype(np.float64) for a in args]
    want = as_tuple(spec.reference_backward(*spec.saved(args64, spec.reference(*args64)), dy.astype(np.float64)))
    for name, t, w in zip(spec.grads, ts, want, strict=True):
        spec.tolerance[name].check(t.grad.numpy(), w, f"{spec.name} {name}")


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
    assert {"matmul", "flash_attention", "embedding", "cast", "loss_scale_update", "sum", "adamw_step"} <= set(declared)
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
    from helios.bench import elementwise, rows

    names = {r["kernel"] for r in elementwise._records(1 << 10, 1, None)}
    names |= {r["kernel"] for r in rows._records(7, 33, np.random.default_rng(0), 1, None)}
    assert {n for s in SPECS for n in (s.name, f"{s.name}_backward")} <= names
