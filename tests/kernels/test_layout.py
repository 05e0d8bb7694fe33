"""Column-block copies (concat / slice) against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from helios import ops
from helios import runtime as rt
from helios.kernels.layout import COPY_COLUMNS, reference_concat
from tests.spirv_val import spirv_cases


@pytest.mark.parametrize("widths", [(1,), (7, 33), (4, 1, 513)])
@pytest.mark.parametrize("rows", [1, 7, 33])
def test_concat_and_slice(rows, widths):
    rng = np.random.default_rng(rows)
    parts = [rng.standard_normal((rows, w)).astype(np.float32) for w in widths]
    out = ops.concat([rt.from_numpy(p) for p in parts])
    expected = reference_concat(parts)
    np.testing.assert_array_equal(out.numpy(), expected)
    start = widths[0] // 2
    np.testing.assert_array_equal(ops.slice_columns(out, start, expected.shape[1]).numpy(), expected[:, start:])


def test_copy_columns_accumulates():
    src = np.arange(12, dtype=np.float32).reshape(3, 4)
    dst = np.ones((3, 6), np.float32)
    d = rt.from_numpy(dst)
    ops.copy_columns(rt.from_numpy(src), d, src_off=1, dst_off=2, n=3, accumulate=True)
    dst[:, 2:5] += src[:, 1:4]
    np.testing.assert_array_equal(d.numpy(), dst)


def test_bad_ranges_are_clear():
    with pytest.raises(ValueError, match="overflow"):
        ops.copy_columns(rt.zeros((2, 3)), rt.zeros((2, 3)), src_off=2, dst_off=0, n=2)


@pytest.mark.parametrize("kernel,variant", spirv_cases([COPY_COLUMNS], sorted(COPY_COLUMNS.variants)))
def test_spirv_valid(kernel, variant, spirv_val):
    spirv_val.check(kernel, variant)
