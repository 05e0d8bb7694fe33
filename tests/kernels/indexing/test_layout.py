"""Column-block copies beyond the op specs' derived tests (tests/kernels/test_opspecs.py runs concat, slice_columns
and copy_columns, copying and adding, against numpy in every dtype): ranges that overflow, and leading dimensions
that differ, are clear errors."""

from __future__ import annotations

import pytest

from helios import ops
from helios import runtime as rt


def test_bad_ranges_are_clear():
    with pytest.raises(ValueError, match="overflow"):
        ops.copy_columns(rt.zeros((2, 3)), rt.zeros((2, 3)), src_off=2, dst_off=0, n=2)
    with pytest.raises(ValueError, match="leading dimensions differ"):
        ops.concat([rt.zeros((2, 3)), rt.zeros((3, 3))])
