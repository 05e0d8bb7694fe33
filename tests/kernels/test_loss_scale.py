"""Dynamic loss scaling on the device: loss_scale_update against its numpy reference over a sequence of
clean and overflowing steps (growth after the interval, halving on NaN and on Inf, the floor and the cap,
the overflow counter), the unscaled norm and clip coefficient, and spirv-val."""

from __future__ import annotations

import math

import numpy as np
import pytest

import helios.runtime as rt
from helios import ops
from helios.kernels.loss_scale import LOSS_SCALE_UPDATE, initial_state, reference_update
from tests.spirv_val import spirv_cases


def test_a_run_of_steps_matches_the_reference():
    norms = [3.0, 5.0, math.inf, 2.0, 1.0, 4.0, math.nan, 0.0, 7.5, 1e-3, 2.0, 3.0]
    state = rt.from_numpy(initial_state(1024.0))
    want = initial_state(1024.0)
    for norm in norms:
        scaled = np.float32(norm * float(want[0])) if math.isfinite(norm) else np.float32(norm)
        true, coef = ops.loss_scale_update(rt.from_numpy(np.array([scaled], np.float32)), state, max_norm=1.0,
                                           growth_interval=3, max_scale=4096.0, min_scale=256.0)
        w_true, w_coef, want = reference_update(scaled, want, 1.0, 3, 4096.0, 256.0)
        got_true, got_coef = float(true.numpy()[0]), float(coef.numpy()[0])
        if math.isfinite(norm):
            assert got_true == pytest.approx(float(w_true), rel=1e-6)
            assert got_coef == pytest.approx(float(w_coef), rel=1e-6)
        else:
            assert not math.isfinite(got_true)
        np.testing.assert_array_equal(state.numpy(), want)
    assert want[2] == 2  # two overflows counted
    assert 256.0 <= want[0] <= 4096.0


def test_growth_caps_and_halving_floors():
    state = rt.from_numpy(initial_state(2048.0))
    one = rt.from_numpy(np.array([1.0], np.float32))
    for _ in range(4):  # grows every step with interval 1, capped at 4096
        ops.loss_scale_update(one, state, max_norm=math.inf, growth_interval=1, max_scale=4096.0)
    assert state.numpy()[0] == 4096.0
    inf = rt.from_numpy(np.array([np.inf], np.float32))
    for _ in range(20):
        ops.loss_scale_update(inf, state, max_norm=math.inf, min_scale=1.0)
    assert state.numpy()[0] == 1.0 and state.numpy()[3] == 1.0


def test_unclipped_coefficient_is_one_over_the_scale():
    state = rt.from_numpy(initial_state(512.0))
    _, coef = ops.loss_scale_update(rt.from_numpy(np.array([100.0], np.float32)), state, max_norm=math.inf)
    assert float(coef.numpy()[0]) == 1.0 / 512.0


def test_bad_arguments():
    norm = rt.from_numpy(np.array([1.0], np.float32))
    with pytest.raises(TypeError, match="4 float32 values"):
        ops.loss_scale_update(norm, rt.from_numpy(np.zeros(3, np.float32)), 1.0)
    with pytest.raises(ValueError, match="growth_interval"):
        ops.loss_scale_update(norm, rt.from_numpy(initial_state()), 1.0, growth_interval=0)


@pytest.mark.parametrize("kernel,variant", spirv_cases([LOSS_SCALE_UPDATE]))
def test_spirv_valid(kernel, variant, spirv_val):
    spirv_val.check(kernel, variant)
