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
        assert after["submits"] == before["submits"]  # queued behind the open batch until something waits
        got.append(z.numpy().copy())
        assert rt.counters()["submits"] == before["submits"] + 1  # the read: one submit, one timeline signal
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


def test_a_staging_read_of_untouched_data_inside_a_capture_is_an_error_too(private_runtime):
    """Through staging, a read of data no open-batch command writes is a side copy of its own (copy_now): it
    is refused inside the scope as well, not run ahead of the captured commands."""
    r = private_runtime(zero_copy=False)
    x, y = rt.from_numpy(np.ones(8, dtype=np.float32)), rt.from_numpy(np.full(8, 5.0, np.float32))
    rt.sync()
    with pytest.raises(HeliosError, match="inside a capture"):
        with Capture(r):
            rt.launch(ADD_INPLACE, [x], push={"n": 8, "c": 1.0}, grid=1)
            y.numpy()
    assert y.numpy().tolist() == [5.0] * 8 and x.numpy().tolist() == [1.0] * 8


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


def _scratch_chain(x, out, n, links=6):
    """out = x * 2**links + (2**links - 1), through a chain of temporaries each freed after its use."""
    t = x
    for _ in range(links):
        u = rt.empty(n)
        rt.launch(AXPB, [t, u], push={"n": n, "a": 2.0, "c": 1.0}, grid=groups(n))
        t = u  # the previous temporary is dropped here: its region is free for the next link
    rt.copy(t, out)


def test_a_capture_reuses_its_own_temporaries_and_holds_them_for_replays(private_runtime):
    r = private_runtime()
    n = 4096
    x, out = rt.from_numpy(np.zeros(n, np.float32)), rt.empty(n)
    rt.sync()
    in_use = r.pool.stats()["pool_in_use"]
    with Capture() as step:
        _scratch_chain(x, out, n)
    # Six temporaries, at most two alive at once: two regions serve them all, held by the capture.
    assert step.pinned == 4  # x, out and two scratch regions
    held = r.pool.stats()
    assert held["pool_in_use"] == in_use + 2 * 4 * n and held["pool_capture_regions"] == 2
    scratch = rt.empty(n)  # lazy work after the scope gets none of the capture's regions
    assert scratch.storage.key not in step._pins
    for v in (1.0, -3.0, 0.5):
        step.write_input(x, np.full(n, v, np.float32))
        rt.fill(scratch, 123.0)  # lazy work on other memory between replays
        step.replay()
        np.testing.assert_array_equal(out.numpy(), np.full(n, v * 64 + 63, np.float32))
    step.close()
    assert r.pool.stats()["pool_in_use"] == in_use + 4 * n and r.pool.stats()["pool_capture_regions"] == 0


def test_a_tensor_from_before_the_capture_freed_inside_it_is_not_reused_inside(private_runtime):
    private_runtime()
    n = 256
    x = rt.from_numpy(np.arange(n, dtype=np.float32))
    pre = rt.empty(n)
    rt.launch(AXPB, [x, pre], push={"n": n, "a": 1.0, "c": 0.0}, grid=groups(n))
    out = rt.empty(n)
    with Capture() as step:
        rt.launch(AXPB, [pre, out], push={"n": n, "a": 2.0, "c": 0.0}, grid=groups(n))  # reads pre
        key = pre.storage.key
        del pre  # replays read its bytes again: they must stay as they are
        later = rt.empty(n)
        assert later.storage.key != key
        rt.launch(AXPB, [x, later], push={"n": n, "a": 5.0, "c": 0.0}, grid=groups(n))
        rt.launch(ADD, [out, later, out], push={"n": n}, grid=groups(n))
    ref = 2 * np.arange(n, dtype=np.float32) + 5 * np.arange(n, dtype=np.float32)
    np.testing.assert_array_equal(out.numpy(), ref)
    step.replay()
    np.testing.assert_array_equal(out.numpy(), ref)
    assert rt.empty(n).storage.key != key  # held for the capture, not handed out
    step.close()


def test_a_tensor_made_in_the_scope_on_reused_scratch_and_never_used_there_is_refused(private_runtime):
    private_runtime()
    n = 256
    x = rt.from_numpy(np.ones(n, np.float32))
    with pytest.raises(HeliosError, match="scratch"):
        with Capture():
            t = rt.empty(n)
            rt.launch(AXPB, [x, t], push={"n": n, "a": 1.0, "c": 0.0}, grid=groups(n))
            del t
            kept = rt.empty(n)  # t's region, which replays rewrite; the capture never writes kept
    assert kept.numpy().shape == (n,)  # the runtime is usable after the refusal


def test_regions_released_after_the_scope_stay_held_until_close(private_runtime):
    r = private_runtime()
    n = 512
    x = rt.from_numpy(np.ones(n, np.float32))
    with Capture() as step:
        y = rt.empty(n)
        rt.launch(AXPB, [x, y], push={"n": n, "a": 3.0, "c": 0.0}, grid=groups(n))
    key = y.storage.key
    del y  # the capture still writes its bytes on every replay
    assert r.pool.stats()["pool_capture_regions"] == 1
    assert rt.empty(n).storage.key != key
    step.replay()
    step.close()
    assert r.pool.stats()["pool_capture_regions"] == 0
    assert rt.empty(n, host_access=True).storage.key == key  # the close waited for the last replay


@pytest.mark.parametrize("zero_copy", [True, False])
def test_reuse_inside_a_capture_is_synchronised(private_runtime, zero_copy):
    """Every temporary reused inside the capture is written only behind a barrier (an independent account)."""
    from tests.runtime.hazards import HazardShadow

    r = private_runtime(zero_copy=zero_copy)
    shadow = HazardShadow(r)
    n = 1000
    x, out = rt.from_numpy(np.full(n, 2.0, np.float32)), rt.empty(n)
    _scratch_chain(x, out, n)  # lazily, with in-batch reuse, first
    with Capture() as step:
        _scratch_chain(x, out, n, links=9)
    step.replay()
    np.testing.assert_array_equal(out.numpy(), np.full(n, 2.0 * 512 + 511, np.float32))
    step.close()
    assert shadow.commands >= 16 and shadow.errors == []
