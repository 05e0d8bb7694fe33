"""bfloat16 and float16 elementwise maps beyond the op specs (whose derived tests, tests/kernels/test_opspecs.py,
run add, sub, mul, div with row and column broadcasts, scale, neg, masked_fill, add_inplace, the activations,
swiglu and the dropout ops in every dtype and forced access): mixing half and fp32 operands, or giving out= of
another dtype, is an error that says what to do."""

from __future__ import annotations

import numpy as np
import pytest

import helios.runtime as rt
from helios import ops
from helios.kernels.contract.dtypes import NUMPY
from tests.conftest import dtype_params


@pytest.mark.parametrize("half", dtype_params("bf16", "fp16"))
def test_mixing_dtypes_is_a_clear_error(half):
    a = rt.from_numpy(np.ones(8, NUMPY[half]))
    b = rt.from_numpy(np.ones(8, np.float32))
    with pytest.raises(TypeError, match=f"mix {half} and f32" if half == "bf16" else "mix f32 and fp16"):
        ops.add(a, b)
    with pytest.raises(ValueError, match="bfloat16|float16"):
        ops.add(a, a, out=rt.empty((8,)))
