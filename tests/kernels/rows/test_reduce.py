"""Reductions beyond the op specs' derived tests (tests/kernels/test_opspecs.py runs sum, mean, max, sum_rows and
sumsq against float64 numpy in every dtype, row layout, reduce_all load and sum_rows plan, at awkward shapes): the
max identity (-inf) on all-negative rows, more rows than workgroups, sum_rows into a view of
an arena with accumulate (half inputs into f32 too), two blocks in one sum_rows pass, sumsq of one flat tensor and of
none, and bad axes.
"""

from __future__ import annotations

import numpy as np
import pytest

import helios.runtime as rt
from helios.kernels.contract.dtypes import NUMPY
from helios.kernels.lib import row_workers as RW
from helios.kernels.rows import reduce as R
from tests.conftest import aligned, dtype_params, needs


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


@pytest.mark.parametrize("dtype", dtype_params("f32", "bf16", "fp16"))
@pytest.mark.parametrize("rows", [5, 700])
def test_sum_rows_accumulate_into_view(rows, dtype, force):
    """out= a view inside a larger f32 arena (bias gradients of any dtype's activations), with accumulate=True
    adding to what is there, then accumulate=False overwriting it."""
    force("sum_rows", R.SumRowsChoice(two_stage=True))
    cols = 12
    x = np.random.default_rng(5).standard_normal((rows, cols)).astype(np.float32).astype(NUMPY[dtype])
    sums = x.astype(np.float64).sum(0)
    at = aligned(8)
    arena = np.arange(at + 32, dtype=np.float32)
    t_arena = rt.from_numpy(arena)
    out = t_arena.view(at, (cols,))
    R.sum_rows(rt.from_numpy(x), out=out, accumulate=True)
    want = arena.astype(np.float64)
    want[at:at + cols] += sums
    np.testing.assert_allclose(t_arena.numpy(), want, rtol=1e-5, atol=1e-4)
    R.sum_rows(rt.from_numpy(x), out=out, accumulate=False)
    want[at:at + cols] = sums
    np.testing.assert_allclose(t_arena.numpy(), want, rtol=1e-5, atol=1e-4)


def test_sumsq_of_one_tensor_none_and_mixed_dtypes():
    """One flat tensor (a gradient arena: its own path), an empty list (0), and tensors of different dtypes."""
    rng = np.random.default_rng(6)
    flat = rng.standard_normal(100_003).astype(np.float32)
    np.testing.assert_allclose(R.sumsq(rt.from_numpy(flat)).numpy(), R.reference_sumsq([flat]), rtol=1e-5)
    np.testing.assert_array_equal(R.sumsq([]).numpy(), [0.0])
    needs(dtype="bf16")
    half = flat[:4097].astype(NUMPY["bf16"])
    mixed = [rt.from_numpy(flat[:231]), rt.from_numpy(half)]  # each tensor's own dtype: f32 and half grads mix
    np.testing.assert_allclose(R.sumsq(mixed).numpy(), R.reference_sumsq([flat[:231], half.astype(np.float64)]),
                               rtol=1e-5)


def test_rejects_other_axes():
    with pytest.raises(ValueError, match="last axis"):
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
