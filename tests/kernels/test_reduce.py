"""Reductions (sum/mean/max over the last axis or everything, sum_rows, sumsq) against numpy in float64.

Tolerance: sums in f32 over up to ~10^5 elements: 1e-4 relative to the sum of |x| (the conditioning of a
sum); max is exact. Every layout ("sg"/"wg") and width ("scalar"/"vec4") is forced in turn.
"""

from __future__ import annotations

import numpy as np
import pytest

import helios.runtime as rt
from helios.kernels import reduce as R
from helios.kernels import rows as RW
from tests.kernels.row_variants import layout_fixture

SHAPES = [(1,), (7,), (1, 1), (1, 4097), (7, 33), (33, 8), (513, 7), (2, 3, 12)]


@pytest.mark.parametrize("kernel,variant", [(k, v) for k in (R.REDUCE_ROWS, R.REDUCE_ALL, R.SUM_ROWS)
                                            for v in k.variants], ids=lambda x: getattr(x, "name", x))
def test_spirv_valid(kernel, variant, spirv_val):
    spirv_val.check(kernel, variant)


layout = layout_fixture([("sg", "vec4"), ("sg", "scalar"), ("sg", "u64x2"), ("wg", "vec4"), ("wg", "scalar")])


@pytest.mark.subgroup("reduce_rows", "reduce_all")
@pytest.mark.parametrize("axis", [-1, None], ids=["last", "all"])
def test_last_axis_and_all(layout, axis, force):
    force("reduce_all", "scalar" if layout[1] == "scalar" else "vec4")  # axis=None: the reduce_all family
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        x = rng.standard_normal(shape).astype(np.float32)
        t = rt.from_numpy(x)
        x64 = x.astype(np.float64)
        expect_shape = (1,) if axis is None or len(shape) == 1 else shape[:-1]
        for op, ref in ((R.reduce_sum, R.reference_sum), (R.mean, R.reference_mean)):
            got = op(t, axis=axis).numpy()
            want = ref(x64, axis).reshape(expect_shape)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.sqrt(x.size),
                                       err_msg=f"{op.__name__} {shape}")
        got = R.reduce_max(t, axis=axis).numpy()
        np.testing.assert_array_equal(got, R.reference_max(x, axis).reshape(expect_shape))


def test_max_of_negative_rows():
    """The max identity is -inf, not 0: all-negative rows and lanes without elements."""
    x = -np.abs(np.random.default_rng(1).standard_normal((9, 5))).astype(np.float32) - 1.0
    np.testing.assert_array_equal(R.reduce_max(rt.from_numpy(x)).numpy(), x.max(-1))
    np.testing.assert_array_equal(R.reduce_max(rt.from_numpy(x), axis=None).numpy(), [x.max()])


def test_many_rows_grid_stride(monkeypatch):
    """More rows than workgroups: the row loop strides over the grid."""
    monkeypatch.setattr(RW, "MAX_GROUPS", 2)
    x = np.random.default_rng(2).standard_normal((300, 5)).astype(np.float32)
    np.testing.assert_allclose(R.reduce_sum(rt.from_numpy(x)).numpy(), x.sum(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.subgroup("reduce_all")
@pytest.mark.parametrize("n", [4 * 4096 + 3, 100_003])
def test_all_two_stage(n):
    """Sizes that take the partials-then-one-workgroup path (vec4 body plus a scalar tail)."""
    x = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    t = rt.from_numpy(x)
    assert R.all_groups(n) > 1
    np.testing.assert_allclose(R.reduce_sum(t, axis=None).numpy(), [x.astype(np.float64).sum()], rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(R.mean(t, axis=None).numpy(), [x.astype(np.float64).mean()], rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(R.reduce_max(t, axis=None).numpy(), [x.max()])


@pytest.mark.parametrize("two_stage", [False, True], ids=["one-pass", "two-stage"])
@pytest.mark.parametrize("width", ["u64x2", "vec4", "scalar"])
@pytest.mark.parametrize("shape", [(1, 1), (7, 33), (64, 12), (65, 7), (513, 4097 // 64), (3000, 36), (4097, 5)])
def test_sum_rows(shape, width, two_stage, force):
    force("sum_rows", R.SumRowsChoice(width, two_stage))
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    want = R.reference_sum_rows(x.astype(np.float64))
    got = R.sum_rows(rt.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.sqrt(shape[0]))


@pytest.mark.parametrize("rows", [5, 700])
def test_sum_rows_accumulate_into_view(rows, force):
    """out= a view inside a larger arena, with accumulate=True adding to what is there."""
    force("sum_rows", R.SumRowsChoice(two_stage=True))
    cols = 12
    x = np.random.default_rng(5).standard_normal((rows, cols)).astype(np.float32)
    arena = np.arange(40, dtype=np.float32)
    t_arena = rt.from_numpy(arena)
    out = t_arena.view(8, (cols,))
    R.sum_rows(rt.from_numpy(x), out=out, accumulate=True)
    want = arena.copy()
    want[8:8 + cols] += x.sum(0)
    np.testing.assert_allclose(t_arena.numpy(), want, rtol=1e-5, atol=1e-4)
    R.sum_rows(rt.from_numpy(x), out=out, accumulate=False)
    want[8:8 + cols] = x.sum(0)
    np.testing.assert_allclose(t_arena.numpy(), want, rtol=1e-5, atol=1e-4)


def test_sumsq_many_tensors():
    rng = np.random.default_rng(6)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in [(1,), (7, 33), (4097,), (300, 300), (3,)]]
    got = R.sumsq([rt.from_numpy(a) for a in arrays]).numpy()
    np.testing.assert_allclose(got, R.reference_sumsq(arrays), rtol=1e-5)
    flat = np.concatenate([a.ravel() for a in arrays])
    np.testing.assert_allclose(R.sumsq(rt.from_numpy(flat)).numpy(), R.reference_sumsq([flat]), rtol=1e-5)
    np.testing.assert_array_equal(R.sumsq([]).numpy(), [0.0])


def test_rejects_other_axes():
    with pytest.raises(ValueError):
        R.reduce_sum(rt.from_numpy(np.zeros((2, 3), np.float32)), axis=0)


@pytest.mark.parametrize("rows,cols", [(7, 12), (300, 12), (300, 13)])
def test_column_sums_of_two_blocks(rows, cols, force):
    """sum_rows_into with two blocks of one buffer into two outputs (one pass), single and two-stage."""
    force("sum_rows", R.SumRowsChoice(two_stage=True))
    rng = np.random.default_rng(7)
    gap = 20  # elements between the blocks (keeps the vec4 form where cols % 4 == 0)
    x = rng.standard_normal(2 * rows * cols + gap).astype(np.float32)
    a, b = x[:rows * cols].reshape(rows, cols), x[rows * cols + gap:].reshape(rows, cols)
    outs = [rt.from_numpy(np.ones(cols, np.float32)), rt.from_numpy(np.ones(cols, np.float32))]
    R.sum_rows_into(rt.from_numpy(x), [0, rows * cols + gap], rows, cols, outs, accumulate=True)
    np.testing.assert_allclose(outs[0].numpy(), 1 + a.sum(0), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(outs[1].numpy(), 1 + b.sum(0), rtol=1e-5, atol=1e-4)
