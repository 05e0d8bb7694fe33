"""launch(): results, hazard tracking (barriers only where needed), flushing, errors, timing."""

from __future__ import annotations

import numpy as np
import pytest

from helios import runtime as rt
from helios.errors import HeliosError
from tests.runtime.kernels import ADD, ADD_INPLACE, AXPB, SCALE, SLOW, groups, slow_iters


def axpb(x, y, a=1.0, c=0.0):
    rt.launch(AXPB, [x, y], push={"n": x.numel, "a": a, "c": c}, grid=(groups(x.numel), 1, 1))


def increment(x, c=1.0):
    rt.launch(ADD_INPLACE, [x], push={"n": x.numel, "c": c}, grid=groups(x.numel))


def settle(runtime):
    """Synchronise everything recorded so far (uploads are copies on staging devices) and zero the counters."""
    runtime.recorder.barrier()
    rt.reset_counters()


def test_dependent_chain_is_correct_with_one_barrier_per_link(runtime):
    x = rt.from_numpy(np.arange(100, dtype=np.float32))
    settle(runtime)
    for _ in range(50):
        increment(x)
    c = rt.counters()
    assert c["dispatches"] == 50 and c["barriers"] == 49 and c["submits"] == 0
    np.testing.assert_array_equal(x.numpy(), np.arange(100, dtype=np.float32) + 50)
    assert rt.counters()["submits"] == 1


def test_raw_chain_through_several_tensors(runtime):
    a = rt.from_numpy(np.arange(300, dtype=np.float32))
    b, c, d = rt.empty(300), rt.empty(300), rt.empty(300)
    settle(runtime)
    axpb(a, b, 2.0, 1.0)  # b = 2a + 1
    axpb(b, c, 3.0, 0.0)  # c = 3b
    rt.launch(ADD, [a, c, d], {"n": 300}, groups(300))  # d = a + c
    assert rt.counters()["barriers"] == 2
    ref = np.arange(300, dtype=np.float32)
    np.testing.assert_allclose(d.numpy(), ref + 3 * (2 * ref + 1))


def test_independent_dispatches_get_no_barrier(runtime):
    x = rt.from_numpy(np.arange(64, dtype=np.float32))
    outs = [rt.empty(64) for _ in range(20)]
    settle(runtime)
    for k, y in enumerate(outs):
        axpb(x, y, 1.0, float(k))
    assert rt.counters()["barriers"] == 0
    for k, y in enumerate(outs):
        np.testing.assert_array_equal(y.numpy(), np.arange(64, dtype=np.float32) + k)


def test_disjoint_views_of_one_arena_get_no_barrier(runtime):
    step = max(1, runtime.info.min_storage_buffer_offset_alignment // 4)
    n = 4 * step
    arena = rt.from_numpy(np.zeros(16 * n, dtype=np.float32))  # a host write: no device hazard yet
    x = rt.from_numpy(np.ones(n, dtype=np.float32))
    settle(runtime)
    views = [arena.view(k * n, n) for k in range(16)]
    for k, v in enumerate(views):
        axpb(x, v, 1.0, float(k))
    assert rt.counters()["barriers"] == 0
    for v in views:  # in-place on each view: each follows a write to the same bytes (RAW)
        increment(v)
    assert rt.counters()["barriers"] == 1  # one barrier covers all of them; then they are independent again
    whole = arena.view(0, 16 * n)
    increment(whole)  # overlaps every view: one more barrier
    assert rt.counters()["barriers"] == 2
    expect = np.repeat(np.arange(16, dtype=np.float32) + 3, n)
    np.testing.assert_array_equal(arena.numpy(), expect)


def test_write_after_read_gets_a_barrier(runtime):
    x = rt.from_numpy(np.arange(64, dtype=np.float32))
    y = rt.empty(64)
    settle(runtime)
    axpb(x, y, 1.0, 0.0)  # reads x
    assert rt.counters()["barriers"] == 0
    rt.fill(x, 5.0)  # then writes x: must wait for the read
    assert rt.counters()["barriers"] == 1
    np.testing.assert_array_equal(y.numpy(), np.arange(64, dtype=np.float32))
    np.testing.assert_array_equal(x.numpy(), np.full(64, 5.0, np.float32))


def test_fill_and_copy_are_ordered_with_dispatches(runtime):
    x = rt.zeros(128)
    settle(runtime)
    increment(x, 2.0)
    y = rt.empty(128)
    rt.copy(x, y)
    increment(y, 1.0)
    rt.fill(x, 0.0)
    # copy after increment (RAW on x), increment after copy (RAW on y); the final fill of x (WAR with the
    # copy's read) is already ordered by the second barrier. (Counted before the reads: on a staging
    # device a read is itself a copy, with its own barrier.)
    assert rt.counters()["barriers"] == 2
    np.testing.assert_array_equal(y.numpy(), np.full(128, 3.0, np.float32))
    np.testing.assert_array_equal(x.numpy(), np.zeros(128, np.float32))


def test_flush_threshold_submits_and_keeps_order(runtime):
    rt.configure(flush_threshold=8)
    x = rt.from_numpy(np.zeros(64, dtype=np.float32))
    for _ in range(30):
        increment(x)
    assert rt.counters()["submits"] == 3  # 24 dispatches submitted by the threshold, 6 still open
    np.testing.assert_array_equal(x.numpy(), np.full(64, 30.0, np.float32))
    assert rt.counters()["submits"] == 4


def test_eager_flush_submits_only_when_the_device_is_idle(runtime):
    rt.configure(eager_flush=4)
    x = rt.zeros(64)
    rt.sync()
    rt.reset_counters()
    for _ in range(4):
        increment(x)
    assert rt.counters()["submits"] == 1 and rt.counters()["pending"] == 0  # idle device: submitted early
    y = rt.empty(1024)
    rt.launch(SLOW, [rt.from_numpy(np.ones(1024, np.float32)), y], {"n": 1024, "iters": slow_iters()}, 16)
    rt.flush()  # the device is busy with the slow kernel now
    before = rt.counters()["submits"]
    for _ in range(8):
        increment(x)
    assert rt.counters()["submits"] == before and rt.counters()["pending"] == 8  # busy: keep batching
    np.testing.assert_array_equal(x.numpy(), np.full(64, 12.0, np.float32))


def test_host_read_flushes_only_what_it_depends_on(runtime):
    a = rt.from_numpy(np.ones(64, dtype=np.float32))
    increment(a)
    np.testing.assert_array_equal(a.numpy(), np.full(64, 2.0, np.float32))
    b = rt.zeros(64)
    increment(b)
    before = rt.counters()
    np.testing.assert_array_equal(a.numpy(), np.full(64, 2.0, np.float32))  # nothing pending writes a
    after = rt.counters()
    assert after["pending"] == 1  # the open batch was not submitted
    if runtime.zero_copy:  # a staging device copies a's bytes in a command buffer of its own
        assert after["submits"] == before["submits"] and after["host_waits"] == before["host_waits"]
    before = rt.counters()
    np.testing.assert_array_equal(b.numpy(), np.ones(64, np.float32))
    assert rt.counters()["submits"] == before["submits"] + 1 and rt.counters()["pending"] == 0


def test_read_of_an_untouched_tensor_does_not_submit(runtime):
    x = rt.from_numpy(np.arange(10, dtype=np.float32))
    rt.sync()
    rt.reset_counters()
    increment(rt.zeros(64))
    np.testing.assert_array_equal(x.numpy(), np.arange(10, dtype=np.float32))
    assert rt.counters()["pending"] == 1
    if runtime.zero_copy:
        assert rt.counters()["submits"] == 0


def test_spec_constants_key_the_pipeline(runtime):
    x = rt.from_numpy(np.arange(64, dtype=np.float32))
    y2, y3, yd = rt.empty(64), rt.empty(64), rt.empty(64)
    rt.launch(SCALE, [x, y2], {"n": 64}, 1, spec={"S": 2.0})
    rt.launch(SCALE, [x, y3], {"n": 64}, 1, spec={"S": 3.0})
    rt.launch(SCALE, [x, yd], {"n": 64}, 1)  # default S = 2
    ref = np.arange(64, dtype=np.float32)
    np.testing.assert_array_equal(y2.numpy(), 2 * ref)
    np.testing.assert_array_equal(y3.numpy(), 3 * ref)
    np.testing.assert_array_equal(yd.numpy(), 2 * ref)


def test_launch_takes_a_module_and_named_variant(runtime):
    x, y = rt.from_numpy(np.ones(8, dtype=np.float32)), rt.empty(8)
    rt.launch(AXPB.module("default"), [x, y], {"n": 8, "a": 4.0, "c": 0.5}, 1)
    np.testing.assert_array_equal(y.numpy(), np.full(8, 4.5, np.float32))
    rt.launch(AXPB, [x, y], {"n": 8, "a": 1.0, "c": 1.0}, 1, variant="default")
    np.testing.assert_array_equal(y.numpy(), np.full(8, 2.0, np.float32))


def test_push_values_of_other_numeric_types(runtime):
    x, y = rt.from_numpy(np.ones(8, dtype=np.float32)), rt.empty(8)
    rt.launch(AXPB, [x, y], {"n": np.int64(8), "a": np.float32(2.0), "c": 1}, 1)
    np.testing.assert_array_equal(y.numpy(), np.full(8, 3.0, np.float32))
    rt.launch(AXPB, [x, y], {"c": 0.5, "a": 1.0, "n": 8.0}, 1)  # a float count converts like pack_push does
    np.testing.assert_array_equal(y.numpy(), np.full(8, 1.5, np.float32))
    with pytest.raises(Exception, match="unknown"):
        rt.launch(AXPB, [x, y], {"n": 8, "a": 1.0, "c": 0.0, "d": 1.0}, 1)


def test_launch_errors(runtime):
    x, y = rt.empty(8), rt.empty(8)
    too_many = runtime.info.max_workgroup_count[0] + 1
    with pytest.raises(HeliosError, match="maximum workgroup count"):
        rt.launch(AXPB, [x, y], {"n": 8, "a": 1.0, "c": 0.0}, (too_many, 1, 1))
    with pytest.raises(HeliosError, match="2 buffer bindings"):
        rt.launch(AXPB, [x], {"n": 8, "a": 1.0, "c": 0.0}, 1)
    with pytest.raises(Exception, match="missing"):
        rt.launch(AXPB, [x, y], {"n": 8}, 1)
    y.release()
    with pytest.raises(HeliosError, match="released"):
        rt.launch(AXPB, [x, y], {"n": 8, "a": 1.0, "c": 0.0}, 1)
    with pytest.raises(HeliosError, match="Kernel or ShaderModule"):
        rt.launch(object(), [], {}, 1)


def test_empty_grid_records_nothing(runtime):
    x, y = rt.empty(0), rt.empty(0)
    axpb(x, y)
    rt.launch(AXPB, [x, y], {"n": 0, "a": 1.0, "c": 0.0}, (0, 1, 1))
    assert rt.counters()["dispatches"] == 1


def test_timed_measures_device_time(runtime):
    x, y = rt.from_numpy(np.ones(256, dtype=np.float32)), rt.empty(256)
    with rt.timed() as t:
        rt.launch(SLOW, [x, y], {"n": 256, "iters": 1000}, groups(256))
    assert t.ms > 0
    np.testing.assert_array_equal(y.numpy(), np.full(256, 1001.0, np.float32))
    ms = rt.time_ms(lambda: increment(x), repeats=3, warmup=1)
    assert len(ms) == 3 and all(m >= 0 for m in ms)


def test_counters_report_everything(runtime):
    c = rt.counters()
    for key in ("dispatches", "submits", "barriers", "host_waits", "pool_bytes", "pool_in_use", "pool_regions",
                "pool_classes", "device_allocs"):
        assert key in c
    increment(rt.zeros(8))
    rt.sync()
    assert rt.counters()["dispatches"] == 1
    rt.reset_counters()
    assert rt.counters()["dispatches"] == 0 and rt.counters()["submits"] == 0


def test_without_push_descriptors(private_runtime):
    private_runtime(push_descriptors=False)
    x = rt.from_numpy(np.arange(64, dtype=np.float32))
    ys = [rt.empty(64) for _ in range(300)]  # more sets than one descriptor pool holds
    for k, y in enumerate(ys):
        axpb(x, y, 1.0, float(k))
    for _ in range(5):
        increment(ys[0])
    np.testing.assert_array_equal(ys[0].numpy(), np.arange(64, dtype=np.float32) + 5)
    np.testing.assert_array_equal(ys[-1].numpy(), np.arange(64, dtype=np.float32) + 299)
    for _ in range(3):  # recycled command buffers reset their descriptor arenas
        increment(ys[1])
        rt.sync()
    np.testing.assert_array_equal(ys[1].numpy(), np.arange(64, dtype=np.float32) + 4)


def test_staging_path(private_runtime):
    r = private_runtime(zero_copy=False)
    assert r.staging is not None
    a = np.arange(1000, dtype=np.float32)
    x = rt.from_numpy(a)
    y = rt.empty(1000)
    axpb(x, y, 2.0, 1.0)
    increment(y)
    np.testing.assert_array_equal(y.numpy(), 2 * a + 2)
    np.testing.assert_array_equal(x.numpy(), a)
    np.testing.assert_array_equal(rt.full(5, 7, np.int32).numpy(), np.full(5, 7, np.int32))
    assert rt.counters()["copies"] >= 4
