"""What the op-spec tests (tests/kernels/test_opspecs.py: loss_scale_update one step at a time, clipped or not,
growing, capped, overflowing, floored) do not cover: a run of clean and overflowing steps (NaN and Inf) on one
device state against its numpy reference, and bad arguments."""

from __future__ import annotations

import math

import numpy as np
import pytest

import helios.runtime as rt
from helios import ops
from helios.kernels.optim.loss_scale import initial_state, reference_update


def test_a_run_of_steps_matches_the_reference():
    norms = [3.0, 5.0, math.inf, 2.0, 1.0, 4.0, math.nan, 0.0, 7.5, 1e-3, 2.0, 3.0]
    state = rt.from_numpy(initial_state(1024.0))
    want = initial_state(1024.0)
    for norm in norms:
        scaled = np.float32(norm * float(want[0])) if math.isfinite(norm) else np.float32(norm)
        true, coef, _ = ops.loss_scale_update(rt.from_numpy(np.array([scaled], np.float32)), state, max_norm=1.0,
                                           growth_interval=3, max_scale=4096.0, min_scale=256.0)
        w_true, w_coef, want = reference_update(scaled, want, 1.0, 3, 4096.0, 256.0)
        got_true, got_coef = float(true.numpy()[0]), float(coef.numpy()[0])
        if math.isfinite(norm):
            assert got_true == pytest.approx(float(w_true[0]), rel=1e-6)
            assert got_coef == pytest.approx(float(w_coef[0]), rel=1e-6)
        else:
            assert not math.isfinite(got_true)
        np.testing.assert_array_equal(state.numpy(), want)
    assert want[2] == 2  # two overflows counted
    assert 256.0 <= want[0] <= 4096.0


def test_bad_arguments():
    norm = rt.from_numpy(np.array([1.0], np.float32))
    with pytest.raises(TypeError, match="4 float32 values"):
        ops.loss_scale_update(norm, rt.from_numpy(np.zeros(3, np.float32)), 1.0)
    with pytest.raises(ValueError, match="growth_interval"):
        ops.loss_scale_update(norm, rt.from_numpy(initial_state()), 1.0, growth_interval=0)
