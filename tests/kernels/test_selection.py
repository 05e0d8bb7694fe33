"""The selection contract (helios.kernels.contract.selection): every family chooses through its rule and is forced
through `selection.force`; no op takes a knob of its own.

Rule-level tests hand the rule a stand-in DeviceInfo (the fields the rules read), so they check both device
classes on any machine; the op-level tests run the forced variant on this device against numpy.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import numpy as np
import pytest

import helios.runtime as rt
from helios import ops
from helios.kernels.contract import selection
from helios.kernels.contract.spec import spec_of
from helios.kernels.indexing import layout as L
from helios.kernels.pointwise import rope as P
from helios.kernels.rows import cross_entropy as C
from helios.kernels.rows import reduce as R

FORCING_KEYWORDS = ("variant", "layout", "tiling")


def _info(cpu: bool = True, **fields):
    """A DeviceInfo stand-in: a lavapipe-like CPU device (fixed subgroup of 8, float atomics) or a GPU."""
    base = {"cpu_profile": cpu, "int64": True, "float_atomic_add_buffer": cpu, "buffer_device_address": cpu,
            "subgroup_size": 8 if cpu else 32, "min_subgroup_size": 8 if cpu else 16,
            "max_subgroup_size": 8 if cpu else 64}
    return SimpleNamespace(**{**base, **fields})


def test_no_op_takes_a_forcing_keyword():
    """Forcing goes through selection.force only: a `variant=`, `layout=` or `tiling=` argument on any op
    of helios.ops would be a second way."""
    knobs = []
    for name in ops.__all__:
        params = inspect.signature(getattr(ops, name)).parameters
        knobs += [f"helios.ops.{name}({p}=)" for p in params if p in FORCING_KEYWORDS]
    assert not knobs, f"force these through helios.kernels.contract.selection instead: {', '.join(knobs)}"


@pytest.mark.parametrize("family,bad", [
    ("embedding_backward", "fast"), ("cross_entropy", "_subgroup"), ("cross_entropy", ("workgroup", 48)),
    ("grad_norm", (3, True)), ("grad_norm", ("lanes", 0)), ("rope", "vec8"), ("layout", "vec4"),
    ("reduce_all", "u64x2"), ("sum_rows", ("vec8",)), ("sum_rows", (None, "yes")),
])
def test_a_bad_forced_choice_is_refused_clearly(family, bad):
    with pytest.raises(ValueError, match=f"unknown {family} choice"):
        selection.force(family, bad)
    assert selection.forced(family) is None


def test_embedding_backward_rule(force):
    choose = lambda planned, info: selection.choose("embedding_backward", (64, 50, 16, planned), info=info)  # noqa: E731
    assert [choose(True, _info()), choose(False, _info()), choose(False, _info(False, float_atomic_add_buffer=False))] \
        == ["sorted", "atomic", "scan"]
    force("embedding_backward", "deterministic")
    assert [choose(True, _info()), choose(False, _info())] == ["sorted", "scan"]
    force("embedding_backward", "scan")
    assert choose(True, _info()) == "scan"
    force("embedding_backward", "sorted")
    with pytest.raises(ValueError, match="needs plan=sorted_segments"):
        choose(False, _info())
    force("embedding_backward", "atomic")
    with pytest.raises(ValueError, match="lacks.*float_atomic_add_buffer"):
        choose(False, _info(float_atomic_add_buffer=False))


def test_cross_entropy_rule(force):
    choose = lambda vocab, info, dtype="f32": selection.choose("cross_entropy", (7, vocab), dtype, info=info)  # noqa: E731
    assert choose(512, _info()) == C.RowPlan("vec4_subgroup", 8)
    assert choose(517, _info(False), "bf16") == C.RowPlan("bf16_scalar", C.WG_ROW)
    force("cross_entropy", ("workgroup", 32))
    assert choose(512, _info()) == C.RowPlan("vec4", 32)
    force("cross_entropy", "subgroup")
    with pytest.raises(ValueError, match="needs a fixed subgroup size"):
        choose(512, _info(False))


def test_grad_norm_rule(force):
    from helios.kernels.optim import adamw as A

    choose = lambda n, info: selection.choose("grad_norm", (n,), info=info)  # noqa: E731
    assert choose(70_001, _info()).variant == "vec4_lanes" and choose(3, _info(False)).variant == "scalar"
    force("grad_norm", ("shared", 5))
    assert choose(70_001, _info()) == A.PartialPlan("vec4", 5)
    force("grad_norm", "lanes")
    assert choose(70_001, _info(False)) == A.PartialPlan("vec4_lanes", A._partial_groups(70_001, 4, True))


def test_rope_rule(force):
    choose = lambda d, inplace=False, dtype="f32": selection.choose("rope", (5, 2, 1, d, inplace), dtype, info=_info())  # noqa: E731
    assert [choose(16), choose(6), choose(16, True, "fp16")] == ["vec4", "scalar", "fp16_vec4_inplace"]
    force("rope", "scalar")
    assert choose(16) == "scalar"
    force("rope", "vec4")
    assert choose(6) == "scalar"  # D/2 % 4 != 0: no vec4 form of this shape


def test_layout_and_reduce_all_rules(force):
    assert selection.choose("layout", (3, 5, True), "bf16", info=_info()) == "bf16_add"
    force("layout", "scalar")
    assert selection.choose("layout", (3, 5, False), info=_info()) == "copy"
    assert selection.choose("reduce_all", (4097, "sumsq"), info=_info()) == "sumsq_vec4"
    assert selection.choose("reduce_all", (3, "max"), info=_info()) == "max_scalar"
    force("reduce_all", "scalar")
    assert selection.choose("reduce_all", (4097, "sum"), "fp16", info=_info()) == "fp16_sum_scalar"


def test_sum_rows_rule_is_its_own_family(force):
    """sum_rows follows the rows family's width rule, but a width forced on "rows" does not reach it."""
    choose = lambda rows, cols, aligned=True, info=None: selection.choose(  # noqa: E731
        "sum_rows", (rows, cols, aligned, False), info=info or _info())
    assert choose(3000, 36) == R.SumRowsPlan("u64x2", True)
    assert choose(3000, 36, info=_info(False)) == R.SumRowsPlan("vec4", True)
    assert choose(100_000, 36) == R.SumRowsPlan("u64x2", False)  # past ONE_PASS_ELEMENTS: chunk partials
    assert choose(3000, 36, aligned=False).variant == "scalar"
    force("rows", ("sg", "scalar", None))
    assert choose(3000, 36).variant == "u64x2"
    force("sum_rows", R.SumRowsChoice("vec4", two_stage=True))
    assert choose(3000, 36) == R.SumRowsPlan("vec4", False)
    assert choose(64, 36).one_pass  # one chunk: nothing to split


def test_forcing_reaches_rope_and_copy_columns(force):
    """The ops run what is forced: rope's scalar form where vec4 is the default, copy_columns' one access."""
    x = np.random.default_rng(0).standard_normal((2, 5, (2 + 2) * 16)).astype(np.float32)
    force("rope", "scalar")
    got = P.rope(rt.from_numpy(x), 2, 1, 16, 10000.0).numpy()
    np.testing.assert_allclose(got, P.reference(x.astype(np.float64), 2, 1, 16, 10000.0), rtol=1e-5, atol=1e-5)
    force("layout", "scalar")
    parts = [np.random.default_rng(k).standard_normal((3, w)).astype(np.float32) for k, w in enumerate((5, 8))]
    np.testing.assert_array_equal(L.concat([rt.from_numpy(p) for p in parts]).numpy(), np.concatenate(parts, -1))


def test_each_rule_declares_what_its_tests_force():
    """Every family of an op spec declares the choices the op-spec tests force (test_opspecs checks that), each one
    its rule accepts; its subgroup cases are among them, and the ops it also serves are registered ops of other
    families (test_opspecs.py reads all three from the rules)."""
    for family in selection.families():
        for choice in family.forced:
            family.check(choice)  # a ValueError names a choice the rule refuses
        for case in family.subgroup:
            assert case.choice in family.forced, f"{family.name}: subgroup case {case.choice!r} is never forced"
        for op in family.also_serves:  # ops of other families (OpSpec.families reads this)
            assert spec_of(op).family != family.name, f"{family.name} serves {op}, one of its own ops already"
    rows = selection.declared("rows")
    case = rows.subgroup_case("softmax", rows.subgroup[-1].choice, "f32")
    assert case is not None and rows.subgroup_case("layernorm", case.choice, "f32") is None  # softmax's only
    assert rows.subgroup_case("softmax", case.choice, "bf16") is None


def test_norm_workers_rule(force):
    """The norms' backward worker count is their rule's choice: CPU_WORKERS on CPU devices, GPU_WORKERS on GPUs,
    never more than the rows (the count the norms used before it was a rule), or a forced count."""
    from helios.kernels.rows import norms

    for cpu, most in ((True, norms.CPU_WORKERS), (False, norms.GPU_WORKERS)):
        for rows in (1, 2, 7, 63, 64, 65, 255, 256, 257, 4096):
            assert selection.choose("norm_workers", (rows,), info=_info(cpu)) == max(1, min(rows, most))
    force("norm_workers", 3)
    assert selection.choose("norm_workers", (100,), info=_info()) == 3
    assert selection.choose("norm_workers", (2,), info=_info()) == 2
    with pytest.raises(ValueError, match="positive number of workers"):
        selection.force("norm_workers", 0)
