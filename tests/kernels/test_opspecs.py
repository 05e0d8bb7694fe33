"""Every op spec (helios.kernels.contract.spec) tested from its one declaration: forward and backward against the numpy
reference at awkward shapes in every forced variant family choice and every dtype (one test per op, choice and
dtype, every shape inside it, so each variant compiles once), gradients added into nonzero f32 sinks, folded
gradients (bit-identical to a separate add), the reference VJP against float64 finite differences, spirv-val
validity of every variant, the derived autograd Function (sinks included), each spec's completeness, helios.ops, the
bench entries and docs/OPS.md's table being current."""

from __future__ import annotations

import re

import numpy as np
import pytest

import helios.runtime as rt
from helios.bench import optable
from helios.kernels.contract import selection
from helios.kernels.contract.dtypes import NUMPY, variant_dtype
from helios.kernels.contract.spec import as_tuple, specs
from helios.kernels.lib.row_workers import RowChoice
from helios.kernels.matmul import select as matmul_select
from tests.kernels.rows.row_variants import layout_id

SPECS = specs()
# What each selection family's tests force, one run each, and which of those CI runs again at subgroup sizes 4 and
# 16 (`-m subgroup`): each family's rule declares both where it is registered (selection.rule's `forced=` and
# `subgroup=`; the why sits beside each rule).
FORCED = {f.name: list(f.forced) for f in selection.families()}


def _id(x) -> str:
    if isinstance(x, RowChoice):
        return layout_id(x)
    return "-".join(map(str, x)) if isinstance(x, tuple) else getattr(x, "name", x)


def _subgroup_case(spec, choice, dtype) -> selection.Subgroup | None:
    """The rule's subgroup case this test is (CI runs it again at other subgroup sizes), or None."""
    return selection.declared(spec.family).subgroup_case(spec.name, choice, dtype)


def _subgroup_kernels(spec, case: selection.Subgroup) -> tuple[str, ...]:
    """The kernels a subgroup-marked case runs: the spec's, or those the case names (a matrix-unit attention
    variant's own)."""
    return case.kernels or tuple(k.name for k in spec.kernels)


def _unavailable(family: str, choice, dtype: str = "f32") -> str | None:
    """Why this device cannot run a forced choice in `dtype` (the rule refuses it), or None. What the device
    contract refuses (64-bit loads, float atomics, device addresses) is _unfit's."""
    from helios.device import get_device
    from helios.kernels.contract import selection

    info = get_device().info
    if (family, choice) == ("cross_entropy", "subgroup") and \
            not info.min_subgroup_size == info.max_subgroup_size == info.subgroup_size:
        return "the subgroup layout needs a fixed subgroup size"
    if family == "attention":
        with selection.forcing("attention", choice):
            if (chosen := selection.choose("attention", (64,), dtype)) != choice:
                return f"the rule runs {chosen} where {choice} is forced in {dtype} on this device"
    if family == "matmul" and not matmul_select.runnable(info, choice, dtype):
        return f"the matmul tiling {choice} in {dtype} needs {_matmul_needs(info, choice)} (the rule gives way to " \
               "its table)"
    return None


def _matmul_needs(info, tiling: str) -> str:
    """What a matmul tiling the device does not run needs (matmul_select.runnable's conditions, named)."""
    if tiling in matmul_select.COOPMAT:
        return "matrix units (real or emulated) that take it"
    if tiling in matmul_select.TILED:
        return f"its workgroup and tiles within maxComputeWorkGroupInvocations {info.max_workgroup_invocations} " \
               f"and maxComputeSharedMemorySize {info.max_shared_memory}"
    lanes = matmul_select.REG_LANES
    missing = [f"subgroups of at least {lanes} lanes (minSubgroupSize {info.min_subgroup_size})"] * \
        (info.min_subgroup_size < lanes) + ["shaderInt64"] * (not info.int64)
    return " and ".join(missing or ["bufferDeviceAddress"])


def _name_tokens(name: str) -> frozenset[str]:
    return frozenset(re.split("[-_]", name)) - {"bf16", "fp16"}


def _unfit(kernels, choice, dtype: str) -> str | None:
    """Why the device contract refuses every variant a forced choice names in `dtype` of one of `kernels`, or
    None. A choice names the variants of a kernel whose name is its words (those the kernel's variant names use:
    RowChoice("sg", "u64x2", 4) names sg_u64x2_reg4), or where none is, every variant holding them all."""
    from tests.conftest import kernel_unmet

    words = _name_tokens(_id(choice))
    for kernel in kernels:
        names = {n: _name_tokens(n) for n, v in kernel.variants.items() if variant_dtype(v.params) == dtype}
        known = words & frozenset().union(*names.values())
        if not known:
            continue
        named = [n for n, t in names.items() if t == known] or [n for n, t in names.items() if known <= t]
        reasons = [kernel_unmet(kernel, n) for n in named]
        if named and all(reasons):
            return reasons[0]
    return None


def _forced_cases() -> list:
    """(spec, forced choice, dtype) triples, one test each (every shape inside it, so each variant compiles once);
    the rules' subgroup cases carry the subgroup mark, and a case storing a half dtype (in its arguments,
    or in its results: cast's) the needs mark of that dtype."""
    cases = []
    for s in SPECS:
        for c in FORCED[s.family]:
            for d in s.tested_dtypes(c):
                sub = _subgroup_case(s, c, d)
                marks = [pytest.mark.subgroup(*_subgroup_kernels(s, sub))] if sub is not None else []
                stored = {d, *(s.scalars[s.dtype_scalar] if s.dtype_scalar else ())}  # cast's results: every dtype
                marks += [pytest.mark.needs(dtype=x) for x in sorted(stored - {"f32"})]
                cases.append(pytest.param(s, c, d, marks=marks))
    return cases


# Each (kernel, variant) once: a kernel may serve more than one spec or both directions (dropout's backward is
# dropout with the same mask).
SPIRV_CASES = list({(k.name, v): (k, v) for s in SPECS for k in s.kernels for v in k.variants}.values())


@pytest.mark.parametrize("kernel,variant", SPIRV_CASES, ids=_id)
def test_spirv_valid(kernel, variant, spirv_val):
    spirv_val.check(kernel, variant)


def _stored(a: np.ndarray, dtype: str) -> np.ndarray:
    """a rounded to dtype (what the kernel is given, and what the float64 reference then sees)."""
    return np.asarray(a, np.float32).astype(NUMPY[dtype])


def _host(spec, name: str, a, dtype: str):
    """Argument or saved tensor `name` as the kernel is given it: index arrays int32 unrounded, floats rounded to
    their storage dtype."""
    if a is None:
        return None
    if name in spec.indices:
        return np.asarray(a, np.int32)
    return _stored(a, spec.storage(name, dtype))


def _device(a):
    return None if a is None else rt.from_numpy(a)


def _wide(a):
    """a as the float64 reference takes it (index arrays stay integer)."""
    return a if a is None or a.dtype.kind in "iu" else a.astype(np.float64)


def _floats(spec, values) -> list:
    """Those of `values` (one per arg) that belong to float args: what gradients pair with."""
    return [v for n, v in zip(spec.args, values, strict=True) if n not in spec.indices]


def _check(spec, name: str, dtype: str, got, want, what: str, sample) -> None:
    stored = spec.result_storage(name, dtype, sample.scalars)
    assert got.dtype == NUMPY[stored], f"{what} {name}: {got.dtype}, expected {stored}"
    sample.tolerance[name].check(got.numpy(), want, stored, f"{what} {name}")


def _run_case(spec, dtype: str, sample, rng, what: str) -> None:
    """Forward against the reference; backward (from the reference's saved tensors rounded to their dtypes, so it
    is tested apart from the forward) against the reference VJP; then, for gradients with sinks, backward again
    into nonzero f32 sinks, which must end as start + gradient."""
    host = [_host(spec, n, a, dtype) for n, a in zip(spec.args, sample.args, strict=True)]
    scalars, keyword = sample.scalars, sample.keyword
    args64 = [_wide(a) for a in host]
    want = as_tuple(spec.apply(spec.reference, args64, keyword, **scalars))
    given = [_device(a) for a in host]
    got = as_tuple(spec.apply(spec.forward, given, keyword, **scalars))
    for name, g, w in zip(spec.outputs, got, want, strict=True):
        if w is None:  # the output of an argument this run does not pass (AdamW's working copy in f32)
            assert g is None, f"{what} {name}: a result for an argument that was None"
            continue
        _check(spec, name, dtype, g, w, what, sample)
    for name, arg in spec.inplace.items():  # written into its argument, not a new tensor
        assert got[spec.outputs.index(name)] is given[spec.args.index(arg)], f"{what} {name}: not written into {arg}"
    if spec.backward is None:  # the spec says it has none
        return
    dy = _stored(rng.standard_normal(want[0].shape), spec.storage(spec.outputs[0], dtype))
    saved = [_host(spec, n, s, dtype) for n, s in zip(spec.saves, spec.saved(args64, want), strict=True)]
    kw = spec.grad_kwargs(scalars)
    kw |= {flag: host[spec.args.index(arg)] is not None for arg, flag in spec.optional.items()}
    kw |= sample.backward_kwargs()
    want_grads = as_tuple(spec.reference_backward(*map(_wide, saved), _wide(dy), **spec.grad_kwargs(scalars)))
    grads = as_tuple(spec.backward(*map(_device, saved), _device(dy), **kw))
    present = _floats(spec, [a is not None for a in host])
    for name, given, g, w in zip(spec.grads, present, grads, want_grads, strict=True):
        if given:
            _check(spec, name, dtype, g, w, what, sample)
        else:
            assert g is None, f"{what} {name}: a gradient for an argument that was None"
    if dtype == "f32":  # half dtypes: tests/kernels/rows/test_norm_fold.py, at one choice per storage width
        _check_folds(spec, dtype, [_device(a) for a in saved], _device(dy), kw, grads, rng, what)
    sunk = [g for g, given in zip(spec.grads, present, strict=True) if given and g in spec.sinks]
    if not sunk:
        return
    start = {g: rng.standard_normal(w.shape).astype(np.float32) for g, w in zip(spec.grads, want_grads) if g in sunk}
    sinks = {g: rt.from_numpy(a) for g, a in start.items()}
    grads = as_tuple(spec.backward(*map(_device, saved), _device(dy), **kw, **{f"{g}_out": t for g, t in sinks.items()},
                                   accumulate=True))
    for name, g, w in zip(spec.grads, grads, want_grads, strict=True):
        if name in sinks:
            assert g is sinks[name], f"{what} {name}: not returned in its sink"
            _check(spec, name, dtype, g, w + start[name], f"{what} (added into a sink)", sample)


def _check_folds(spec, dtype: str, saved, dy, kw: dict, grads: tuple, rng, what: str) -> None:
    """For each gradient the spec folds (a norm's dx): backward given another gradient of that arg (random, with a
    -0.0 and the negated gradient among its values) returns exactly ops.add(that, gradient), bit for bit (f32 at
    every forced choice; the half dtypes are test_norm_fold's)."""
    from helios import ops

    floats = [a for a in spec.args if a not in spec.indices]
    for arg, keyword in spec.folds.items():
        plain = grads[floats.index(arg)]
        extra = rng.standard_normal(plain.shape).reshape(-1)
        extra[0] = -0.0
        extra[1::3] = -plain.numpy().astype(np.float32).reshape(-1)[1::3]  # sums of exactly 0
        extra = rt.from_numpy(_stored(extra.reshape(plain.shape), spec.storage(f"d{arg}", dtype)))
        got = as_tuple(spec.backward(*saved, dy, **kw, **{keyword: extra}))[floats.index(arg)]
        want = ops.add(extra, plain).numpy()
        assert got.dtype == want.dtype, f"{what} d{arg} folded: {got.dtype}, expected {want.dtype}"
        bits = np.uint16 if want.itemsize == 2 else np.uint32
        mismatch = np.flatnonzero(got.numpy().view(bits) != want.view(bits))
        assert not mismatch.size, (f"{what} d{arg} + {keyword}: {mismatch.size} elements differ from a separate add, "
                                   f"first at {mismatch[0]}")


@pytest.mark.parametrize("spec,choice,dtype", _forced_cases(), ids=_id)
def test_forward_and_backward_against_reference(spec, choice, dtype, force, request):
    if reason := _unavailable(spec.family, choice, dtype) or _unfit(spec.kernels, choice, dtype):
        pytest.skip(reason)
    subgroup_stage = request.config.option.markexpr.strip() == "subgroup"
    sub = _subgroup_case(spec, choice, dtype) if subgroup_stage else None
    keep = sub.shapes if sub is not None else None  # the shapes the subgroup stage runs (None: all)
    force(spec.family, choice)
    for family in spec.families[1:]:  # the k-th choice of spec.family with the k-th (cycling) of each other one
        others = [c for c in FORCED[family] if not _unfit(spec.kernels, c, dtype)]  # all of them where all fit
        force(family, others[FORCED[spec.family].index(choice) % len(others)])
    rng = np.random.default_rng(0)
    for sample in spec.sample_inputs(dtype, choice, rng, keep=keep):  # drawn as iterated: the rng runs on between
        what = f"{spec.name} {sample.shape} {sample.scalars}" + (f" {sample.label}" if sample.label else "")
        _run_case(spec, dtype, sample, rng, what)


@pytest.mark.parametrize("spec", [s for s in SPECS if s.backward is not None], ids=_id)
def test_reference_backward_matches_finite_differences(spec):
    """Each gradient of the float64 reference VJP against central differences of <dy, reference(args)>, for every
    scalar case."""
    rng = np.random.default_rng(1)
    for sample in spec.sample_inputs("f32", None, rng, "gradcheck"):
        scalars = sample.scalars
        args = [_wide(a) for a in sample.args]
        want = spec.reference(*args, **scalars)
        dy = rng.standard_normal(as_tuple(want)[0].shape)
        grads = as_tuple(spec.reference_backward(*spec.saved(args, want), dy, **spec.grad_kwargs(scalars)))

        def y(k: int, arg: np.ndarray) -> np.ndarray:
            return as_tuple(spec.reference(*args[:k], arg, *args[k + 1:], **scalars))[0]  # noqa: B023

        h = 1e-6
        floats = [k for k, n in enumerate(spec.args) if n not in spec.indices]  # index args take no gradient
        for k, name, grad in zip(floats, spec.grads, grads, strict=True):
            arg = args[k]
            numeric = np.zeros_like(arg)
            for i in np.ndindex(arg.shape):
                e = np.zeros_like(arg)
                e[i] = h
                numeric[i] = np.sum(dy * (y(k, arg + e) - y(k, arg - e))) / (2 * h)  # difference first: no cancellation
            np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-7, err_msg=f"{spec.name} {name} {scalars}")


@pytest.mark.parametrize("spec", [s for s in SPECS if s.autograd], ids=_id)
def test_autograd_function_and_functional(spec):
    """The derived Function through autograd.functional: its gradients, and for gradients with sinks (parameters),
    their accumulation into the parameters' gradient arena across two backward passes."""
    import autograd
    import autograd.functional as F

    rng = np.random.default_rng(2)
    (sample,) = spec.sample_inputs("f32", None, rng, "autograd")
    scalars, args = sample.scalars, sample.args
    ts = [autograd.tensor(a) if n in spec.indices else autograd.Parameter(a) if f"d{n}" in spec.sinks
          else autograd.tensor(a, requires_grad=True) for n, a in zip(spec.args, args, strict=True)]
    args64 = [_wide(a) for a in args]
    y64 = spec.reference(*args64, **scalars)
    dy = rng.standard_normal(as_tuple(y64)[0].shape).astype(np.float32)
    want = as_tuple(spec.reference_backward(*spec.saved(args64, y64), dy.astype(np.float64),
                                            **spec.grad_kwargs(scalars)))
    for passes in (1, 2):  # the second backward adds to the first
        F.mul(F.OF_SPEC[spec.name](*ts, **scalars), autograd.tensor(dy)).sum(axis=None).backward()
        for name, t, w in zip(spec.grads, _floats(spec, ts), want, strict=True):
            sample.tolerance[name].check(t.grad.numpy(), passes * w, "f32", f"{spec.name} {name} pass {passes}")


@pytest.mark.parametrize("spec", [s for s in SPECS if s.needs], ids=_id)
def test_backward_skips_the_gradients_not_needed(spec):
    """A backward taking `needs=` returns None for each gradient it is told to skip, and the others unchanged."""
    rng = np.random.default_rng(3)
    sample = next(spec.sample_inputs("f32", None, rng, "gradcheck"))
    scalars, args = sample.scalars, sample.args
    targs = [rt.from_numpy(a) for a in args]
    y = spec.apply(spec.forward, targs, **scalars)
    dy = rt.from_numpy(rng.standard_normal(as_tuple(y)[0].shape).astype(np.float32))
    kwargs = {**spec.grad_kwargs(scalars), **sample.backward_kwargs()}
    full = [g.numpy() for g in as_tuple(spec.backward(*spec.saved(targs, y), dy, **kwargs))]
    for skipped in range(len(spec.grads)):
        needs = tuple(k != skipped for k in range(len(spec.grads)))
        got = as_tuple(spec.backward(*spec.saved(targs, y), dy, needs=needs, **kwargs))
        assert got[skipped] is None, f"{spec.name}: {spec.grads[skipped]} computed though not needed"
        for k in range(len(spec.grads)):
            if k != skipped:
                np.testing.assert_array_equal(got[k].numpy(), full[k], err_msg=f"{spec.name} {spec.grads[k]}")


@pytest.mark.parametrize("name", ["dropout", "residual_dropout_add"])
def test_dropout_specs_run_every_awkward_shape(name):
    """Their shapes are a list of their own (each draws its own p, seed and offset), so nothing else makes sure it
    still holds the pointwise ops' awkward shapes."""
    from helios.kernels.contract.spec import AWKWARD_SHAPES, spec_of

    assert set(AWKWARD_SHAPES) <= set(spec_of(name).shapes)


@pytest.mark.parametrize("spec", SPECS, ids=_id)
def test_every_spec_is_complete(spec):
    """Reference, forward and backward (or none, said by backward=None with no reference_backward), a selection
    family, registered kernels whose every variant test_spirv_valid checks, every tested dtype offered by every
    kernel, inputs float32 (int32 for index args), and names that agree (saves, sinks, optional args, scalars);
    test_forward_and_backward_against_reference
    runs it in every dtype and forced choice."""
    from helios.kernels.contract import selection
    from helios.kernels.contract.dtypes import variant_dtype
    from helios.spirv import registry

    assert callable(spec.reference) and callable(spec.forward) and callable(spec.inputs)
    assert (spec.backward is None) == (spec.reference_backward is None), "a backward needs its reference and back"
    assert selection._family(spec.family).name == spec.family
    for family in spec.families:
        assert selection._family(family).name == family
        assert FORCED[family], f"no forced choices for family {family}"
    registered = {k.name: k for k in registry.load_all()}
    validated = {(k.name, v) for k, v in SPIRV_CASES}
    for kernel in spec.kernels:
        assert registered.get(kernel.name) is kernel, f"{kernel.name} is not the registered kernel of that name"
        assert {(kernel.name, v) for v in kernel.variants} <= validated
        offered = {variant_dtype(v.params) for v in kernel.variants.values()}
        assert set(spec.dtypes) <= offered, f"{kernel.name} offers {sorted(offered)}, the spec tests {spec.dtypes}"
    assert set(spec.saves) <= set(spec.args) | set(spec.outputs)
    assert set(spec.sinks) <= set(spec.grads) and set(spec.sinks) <= set(spec.f32), "sinks are f32 gradients"
    assert set(spec.optional) <= set(spec.args)
    args = spec.inputs(np.random.default_rng(0), spec.shapes[0], **spec.scalar_cases()[0])
    for name, a in zip(spec.args, args, strict=True):
        want = np.int32 if name in spec.indices else np.float32
        assert a.dtype == want, f"input {name} is {a.dtype}, expected {np.dtype(want)} (index args are int32)"
    assert all(isinstance(v, tuple) and v for v in spec.scalars.values()), "each scalar needs test values"
    assert set(spec.grad_kwargs(spec.scalars)) <= set(spec.scalars)
    assert len(spec.kernels) >= (2 if spec.backward else 1)


def test_helios_ops_exports_every_spec():
    from helios import ops

    for s in SPECS:
        assert getattr(ops, s.name) is s.forward
        if s.backward is not None:
            assert getattr(ops, f"{s.name}_backward") is s.backward
        else:  # a forward-only op declares no backward
            assert f"{s.name}_backward" not in ops.__all__
        assert s.name in ops.__all__


def test_helios_ops_finds_every_declared_op():
    """Each kernel file declares its op functions at import (declare_ops, or an op spec's register): every name
    resolves to a function of its declaring file, and a file's public op function that it forgot to declare would
    be missed (docs/OPS.md names it)."""
    from helios import ops

    declared = ops.declared()
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
        "docs/OPS.md's op table is stale: run python -m helios.bench.optable"


def test_bench_has_every_spec():
    from helios.bench import adamw as optimizer
    from helios.bench import attention, cross_entropy, decode, elementwise, embedding, matmul, rows

    rng = np.random.default_rng(0)
    records = elementwise._records(1 << 10, 1, None) + rows._records(7, 33, rng, 1, None) + rows.case_records(rng, 1)
    records += optimizer._records(1 << 10, rng, 1) + optimizer.once_records(rng, 1)
    records += embedding.records([(1, 7, 12)], rng, 1) + cross_entropy.records([(7, 33)], rng, 1)
    records += attention.records([(1, 2, 7, 64)], rng, 1, with_torch=False, with_helios_unfused=False)
    records += matmul.bench_shape("nt", 7, 33, 12, None, 1, None, False, backward=True)
    records += decode.records(rng, 1)
    names = {r.get("op", r["kernel"]) for r in records}  # matmul and attention name their kernels, `op` the spec
    assert {n for s in SPECS for n in (s.name, f"{s.name}_backward") if s.backward or n == s.name} <= names
