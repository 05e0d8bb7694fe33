"""Capture and replay: replays match lazy recording, record 0 dispatches, and read per-step values from buffers."""

from __future__ import annotations

import numpy as np
import pytest

from helios import runtime as rt
from helios.errors import HeliosError
from helios.runtime.capture import Capture
from tests.runtime.kernels import ADD, ADD_INPLACE, AXPB, groups


def chain(x, y, z, out):
    """A few dependent dispatches with temporaries: out = (x*2+1) + y, then z += out-derived values."""
    t = rt.empty(x.numel)
    rt.launch(AXPB, [x, t], push={"n": x.numel, "a": 2.0, "c": 1.0}, grid=groups(x.numel))
    rt.launch(ADD, [t, y, out], push={"n": x.numel}, grid=groups(x.numel))
    rt.launch(ADD, [z, out, z], push={"n": x.numel}, grid=groups(x.numel))
    rt.launch(ADD_INPLACE, [z], push={"n": x.numel, "c": 0.5}, grid=groups(x.numel))


def test_replay_matches_lazy_and_records_no_dispatches(runtime):
    n = 33
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(5)]
    y0 = rng.standard_normal(n).astype(np.float32)

    # Lazy reference: five steps recorded anew each time.
    x, y, z, out = rt.from_numpy(xs[0]), rt.from_numpy(y0), rt.zeros(n), rt.empty(n)
    lazy = []
    for xv in xs:
        x = rt.from_numpy(xv)
        chain(x, y, z, out)
        lazy.append(z.numpy().copy())

    # Captured once, then the input buffer is rewritten and the step replayed.
    x, z, out = rt.from_numpy(xs[0]), rt.zeros(n), rt.empty(n)
    with Capture() as step:
        chain(x, y, z, out)
    assert step.dispatches == 4 and step.pinned >= 5
    got = [z.numpy().copy()]
    for xv in xs[1:]:
        step.write_input(x, xv)
        before = rt.counters()
        step.replay()
        after = rt.counters()
        assert after["dispatches"] == before["dispatches"]  # 0 dispatches recorded on the host
        assert after["submits"] == before["submits"] + 1  # one submit, one timeline signal
        got.append(z.numpy().copy())
    for a, b in zip(lazy, got):
        np.testing.assert_array_equal(a, b)
    step.close()


def test_lazy_work_around_a_replay_is_ordered(runtime):
    x = rt.from_numpy(np.arange(40, dtype=np.float32))
    with Capture() as step:
        rt.launch(ADD_INPLACE, [x], push={"n": 40, "c": 1.0}, grid=groups(40))
    for _ in range(3):
        rt.launch(ADD_INPLACE, [x], push={"n": 40, "c": 10.0}, grid=groups(40))  # lazy, before the replay
        step.replay()
    np.testing.assert_array_equal(x.numpy(), np.arange(40, dtype=np.float32) + 4 + 30)
    step.close()


def test_host_read_inside_a_capture_is_an_error_and_leaves_the_runtime_usable(runtime):
    x = rt.from_numpy(np.ones(8, dtype=np.float32))
    with pytest.raises(HeliosError, match="inside a capture"):
        with Capture():
            rt.launch(ADD_INPLACE, [x], push={"n": 8, "c": 1.0}, grid=1)
            x.numpy()
    rt.launch(ADD_INPLACE, [x], push={"n": 8, "c": 1.0}, grid=1)
    assert x.numpy().tolist() == [2.0] * 8  # the aborted capture's dispatch never ran


def test_an_upload_inside_a_capture_is_an_error(runtime):
    """Host bytes uploaded inside the scope would be frozen into every replay: refused, with the way out."""
    with pytest.raises(HeliosError, match="write_input"):
        with Capture():
            rt.from_numpy(np.ones(4, np.float32))
    assert rt.from_numpy(np.ones(4, np.float32)).numpy().tolist() == [1.0] * 4  # uploads work again after


def test_write_input_checks_dtype_and_size(runtime):
    from helios.runtime.capture import write_fixed

    x = rt.zeros((4,))
    with pytest.raises(HeliosError, match="write_input"):
        write_fixed(x, np.ones(4, np.int32))
    with pytest.raises(HeliosError, match="write_input"):
        write_fixed(x, np.ones(3, np.float32))
    write_fixed(x, np.arange(4, dtype=np.float32))
    assert x.numpy().tolist() == [0.0, 1.0, 2.0, 3.0]
