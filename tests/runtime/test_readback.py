"""Readback: several small tensors read back in one host read, on zero-copy memory and through staging, also
when the copies are captured with the step that writes the tensors; and a captured replay is queued, not
submitted, until the read."""

from __future__ import annotations

import numpy as np
import pytest

from helios import runtime as rt
from helios.errors import HeliosError
from helios.runtime.capture import Capture
from tests.runtime.kernels import AXPB, groups


@pytest.mark.parametrize("zero_copy", [True, False], ids=["zero_copy", "staging"])
def test_one_read_returns_every_slot(private_runtime, zero_copy):
    r = private_runtime(zero_copy=zero_copy)
    rb = rt.Readback({"a": 1, "b": 4, "c": 1}, r)
    a, b = rt.from_numpy(np.array([1.5], np.float32)), rt.empty(4)
    rt.launch(AXPB, [rt.from_numpy(np.arange(4, dtype=np.float32)), b], {"n": 4, "a": 2.0, "c": 1.0}, groups(4))
    rb.record(a=a, b=b)
    rt.reset_counters()
    got = rb.read()
    np.testing.assert_array_equal(got["a"], [1.5])
    np.testing.assert_array_equal(got["b"], [1.0, 3.0, 5.0, 7.0])
    c = rt.counters()
    assert c["submits"] == 1 and c["host_waits"] <= 1 and c["downloads"] == 0, c


@pytest.mark.parametrize("zero_copy", [True, False], ids=["zero_copy", "staging"])
def test_captured_copies_are_read_after_each_replay_with_one_submit_and_one_wait(private_runtime, zero_copy):
    r = private_runtime(zero_copy=zero_copy)
    x = rt.from_numpy(np.zeros(4, np.float32))
    y = rt.empty(4)
    rb = rt.Readback({"y": 4}, r)
    with Capture(r) as step:
        rt.launch(AXPB, [x, y], {"n": 4, "a": 1.0, "c": 1.0}, groups(4))  # y = x + 1
        rt.launch(AXPB, [y, x], {"n": 4, "a": 1.0, "c": 0.0}, groups(4))  # x = y
        rb.record(y=y)
    np.testing.assert_array_equal(rb.read()["y"], [1, 1, 1, 1])
    for k in range(2, 5):
        rt.reset_counters()
        step.replay()
        assert rt.counters()["submits"] == 0  # queued until something needs it
        np.testing.assert_array_equal(rb.read()["y"], [k] * 4)
        c = rt.counters()
        assert c["submits"] == 1 and c["host_waits"] <= 1, c  # no wait at all if the device was already done
    step.close()


def test_two_captures_queued_back_to_back_go_in_one_submit_in_order(private_runtime):
    r = private_runtime()
    x = rt.from_numpy(np.ones(8, np.float32))
    with Capture(r) as double:
        rt.launch(AXPB, [x, x], {"n": 8, "a": 2.0, "c": 0.0}, groups(8))
    with Capture(r) as add_one:
        rt.launch(AXPB, [x, x], {"n": 8, "a": 1.0, "c": 1.0}, groups(8))
    np.testing.assert_array_equal(x.numpy(), [3] * 8)  # (1 * 2) + 1
    rt.reset_counters()
    double.replay()
    add_one.replay()
    np.testing.assert_array_equal(x.numpy(), [7] * 8)  # order kept: (3 * 2) + 1, not (3 + 1) * 2
    assert rt.counters()["submits"] == 1
    double.close()
    add_one.close()


def test_wrong_slots_are_refused(private_runtime):
    r = private_runtime()
    rb = rt.Readback({"loss": 1}, r)
    with pytest.raises(HeliosError, match="no slot 'norm'"):
        rb.record(norm=rt.zeros(1))
    with pytest.raises(HeliosError, match="takes 1 float32 values, got 2"):
        rb.record(loss=rt.zeros(2))
