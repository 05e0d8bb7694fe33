"""BufferPool: timeline-gated reuse, steady state without new allocations, out-of-memory handling."""

from __future__ import annotations

import numpy as np
import pytest

from helios import runtime as rt
from helios.errors import HeliosError, OutOfMemoryError
from tests.runtime.kernels import ADD_INPLACE, AXPB, SLOW, groups, slow_iters


def test_region_in_flight_is_not_handed_to_the_host_before_the_semaphore_passes(private_runtime):
    runtime = private_runtime()  # a fresh pool: no other free regions of these size classes
    n = 1024
    x = rt.from_numpy(np.ones(n, dtype=np.float32))
    y = rt.empty(n)
    rt.launch(SLOW, [x, y], {"n": n, "iters": slow_iters()}, groups(n))  # tens of ms on lavapipe
    rt.flush()  # submitted, not waited for
    rec = runtime.recorder
    tag = y.storage.last_use
    key = y.storage.key
    y.release()
    # The device is still running the slow kernel that writes y's region.
    assert rec.completed_value() < tag, "the slow kernel finished too early for this test to mean anything"
    fresh = [rt.from_numpy(np.full(n, 7.0, np.float32)) for _ in range(3)]  # host writes: never y's region
    assert all(t.storage.key != key for t in fresh)
    rt.sync()
    assert rec.completed >= tag
    for t in fresh:  # the slow kernel's writes landed in y's region, not in these
        np.testing.assert_array_equal(t.numpy(), np.full(n, 7.0, np.float32))
    assert rt.empty(n, host_access=True).storage.key == key  # now it is handed out again


def test_device_output_reuses_a_region_in_flight_behind_a_barrier(private_runtime):
    private_runtime()
    n = 1024
    x = rt.from_numpy(np.ones(n, dtype=np.float32))
    y = rt.empty(n)
    rt.launch(SLOW, [x, y], {"n": n, "iters": slow_iters()}, groups(n))
    rt.flush()
    key, tag = y.storage.key, y.storage.last_use
    y.release()
    rt.reset_counters()
    z = rt.empty(n)  # only device commands write it: it may take y's region while the slow kernel runs
    assert z.storage.key == key and z.storage.last_use == tag  # a host access to z still waits for y's work
    rt.launch(AXPB, [x, z], {"n": n, "a": 3.0, "c": 1.0}, groups(n))
    c = rt.counters()
    assert c["barriers"] == 1 and c["host_waits"] == 0 and c["device_allocs"] == 0  # write-after-write
    np.testing.assert_array_equal(z.numpy(), np.full(n, 4.0, np.float32))


def test_release_in_the_open_batch_is_reused_in_that_batch_for_device_outputs(private_runtime):
    private_runtime()
    x = rt.from_numpy(np.arange(64, dtype=np.float32))
    y = rt.empty(64)
    rt.launch(AXPB, [x, y], {"n": 64, "a": 1.0, "c": 0.0}, 1)
    w = rt.empty(64)
    rt.launch(AXPB, [y, w], {"n": 64, "a": 2.0, "c": 0.0}, 1)  # reads y (a barrier: read-after-write)
    key = y.storage.key
    del y  # used by the open (unsubmitted) batch
    host = rt.from_numpy(np.zeros(64, np.float32))  # a host write must not land in bytes the batch still reads
    assert host.storage.key != key
    z = rt.empty(64)  # a device output may: its write waits behind a barrier for the read of y
    assert z.storage.key == key
    before = rt.counters()["barriers"]
    rt.launch(AXPB, [x, z], {"n": 64, "a": -1.0, "c": 0.0}, 1)
    assert rt.counters()["barriers"] == before + 1  # write-after-read on y's old bytes
    assert rt.counters()["submits"] == 0  # all in one batch
    np.testing.assert_array_equal(w.numpy(), 2 * np.arange(64, dtype=np.float32))
    np.testing.assert_array_equal(z.numpy(), -np.arange(64, dtype=np.float32))


def _training_step(params):
    acts = [rt.empty(n) for n in (1000, 5000, 20000, 5000, 333)]
    for a in acts:
        rt.fill(a, 1.0)
        rt.launch(ADD_INPLACE, [a], {"n": a.numel, "c": 1.0}, groups(a.numel))
    for p in params:
        rt.launch(ADD_INPLACE, [p], {"n": p.numel, "c": 0.5}, groups(p.numel))
    return float(acts[2].numpy()[0])  # a host read, as a loss read would be


def test_steady_state_makes_no_device_allocation(runtime):
    params = [rt.zeros(n) for n in (4096, 128, 65536)]
    assert _training_step(params) == 2.0  # warm-up
    rt.sync()
    before = rt.counters()
    for _ in range(3):
        _training_step(params)
    after = rt.counters()
    assert after["device_allocs"] == before["device_allocs"]
    assert after["pool_bytes"] == before["pool_bytes"]
    np.testing.assert_array_equal(params[0].numpy(), np.full(4096, 2.0, np.float32))


def test_out_of_memory_is_clear_and_the_pool_stays_usable(private_runtime, monkeypatch):
    # Small blocks: with the GPU profile's 256 MiB ones, a tensor a block long would pass one buffer's limit.
    runtime = private_runtime(block_size=4 << 20)
    pool = runtime.pool
    vk = runtime.device.vk

    def fail(alloc):
        raise vk.VkErrorOutOfDeviceMemory()

    pool.trim()  # earlier tests may have left a free region of this size class cached
    monkeypatch.setattr(pool, "_allocate_memory", fail)
    big = pool.block_size + 1024  # needs a block of its own
    with pytest.raises(OutOfMemoryError) as info:
        rt.empty(big // 4)
    message = str(info.value)
    assert str(big) in message and "smaller batch" in message and "reserved" in message
    monkeypatch.undo()
    t = rt.from_numpy(np.arange(10, dtype=np.float32))
    np.testing.assert_array_equal(t.numpy(), np.arange(10, dtype=np.float32))


def test_trim_frees_blocks_nobody_holds(private_runtime):
    r = private_runtime(block_size=1 << 20)
    big = rt.empty((1 << 20) // 4 + 64)  # bigger than a block: a dedicated block
    rt.fill(big, 1.0)
    reserved = r.pool.stats()["pool_bytes"]
    del big
    assert r.pool.trim() > 0
    assert r.pool.stats()["pool_bytes"] < reserved


def test_pool_statistics(runtime):
    before = rt.counters()
    keep = [rt.empty(n) for n in (10, 100, 1000, 10000)]
    after = rt.counters()
    assert after["pool_in_use"] >= before["pool_in_use"] + sum(t.nbytes for t in keep)
    assert after["pool_regions"] >= before["pool_regions"]
    assert after["pool_classes"] >= 3 and after["pool_bytes"] >= after["pool_in_use"]


# One region per block: a block of 64 KiB holds exactly one tensor of 16384 floats.
BLOCK = 64 * 1024
N = BLOCK // 4


def _in_flight_pair():
    """x and y fill two blocks; y is released while the open batch still writes it."""
    x = rt.from_numpy(np.ones(N, dtype=np.float32))
    y = rt.empty(N)
    rt.launch(AXPB, [x, y], {"n": N, "a": 2.0, "c": 0.0}, groups(N))
    key = y.storage.key
    del y
    return x, key


def test_a_full_pool_within_budget_grows_instead_of_waiting(private_runtime):
    r = private_runtime(block_size=BLOCK)
    x, key = _in_flight_pair()
    rt.reset_counters()
    # For a host write, the only free region of the class is in the open batch: waiting would submit it.
    z = rt.empty(N, host_access=True)
    c = rt.counters()
    assert z.storage.key != key
    assert c["device_allocs"] == 1 and c["submits"] == 0 and c["host_waits"] == 0
    assert r.recorder.pending == 1  # recording was not cut short
    np.testing.assert_array_equal(x.numpy(), np.ones(N, np.float32))


def test_over_budget_the_pool_waits_for_an_in_flight_region(private_runtime):
    private_runtime(block_size=BLOCK, memory_budget=2 * BLOCK)
    x, key = _in_flight_pair()
    rt.reset_counters()
    z = rt.empty(N, host_access=True)
    c = rt.counters()
    assert z.storage.key == key and c["device_allocs"] == 0 and c["pool_bytes"] == 2 * BLOCK
    assert c["host_waits"] + c["submits"] >= 1  # it had to let the device finish the batch


def test_over_budget_idle_blocks_are_given_back_before_growing(private_runtime):
    private_runtime(block_size=BLOCK, memory_budget=2 * BLOCK)
    a, held = rt.empty(N), rt.empty(N)
    assert held.storage.key != a.storage.key
    del a  # its block holds only a free region the device never used
    c = rt.empty(N // 2)  # another size class: nothing of it to wait for
    s = rt.counters()
    assert s["pool_bytes"] == 2 * BLOCK and s["pool_in_use"] == BLOCK + BLOCK // 2
    rt.fill(c, 3.0)
    np.testing.assert_array_equal(c.numpy(), np.full(N // 2, 3.0, np.float32))


def test_budget_from_the_environment(private_runtime, monkeypatch):
    blocks = 64 << 20  # the default on unified memory (the GPU profile's is 256 MiB)
    monkeypatch.setenv("HELIOS_MEMORY_BUDGET_MB", "96")
    assert private_runtime(block_size=blocks).pool.budget == 96 << 20
    monkeypatch.setenv("HELIOS_MEMORY_BUDGET_MB", "3")  # below one 64 MiB block: it could not cap anything
    with pytest.raises(HeliosError, match="below one memory block"):
        private_runtime(block_size=blocks)
    monkeypatch.setenv("HELIOS_MEMORY_BUDGET_MB", "lots")
    with pytest.raises(HeliosError, match="HELIOS_MEMORY_BUDGET_MB"):
        private_runtime()
    monkeypatch.delenv("HELIOS_MEMORY_BUDGET_MB")
    r = private_runtime()
    heap = r.info.memory_types[r.pool.memory_types[0]].heap
    assert r.pool.budget == r.info.memory_heaps[heap][0] * 3 // 4


def test_tensors_freed_in_a_step_are_reused_in_the_next(private_runtime):
    private_runtime()  # a fresh pool, so that every region of the step is the step's own
    params = [rt.zeros(n) for n in (4096, 128, 65536)]

    def step():
        acts = [rt.empty(n) for n in (1000, 5000, 20000, 5000, 333)]
        keys = {a.storage.key for a in acts}
        for a in acts:
            rt.fill(a, 1.0)
            rt.launch(ADD_INPLACE, [a], {"n": a.numel, "c": 1.0}, groups(a.numel))
        for p in params:
            rt.launch(ADD_INPLACE, [p], {"n": p.numel, "c": 0.5}, groups(p.numel))
        assert float(acts[2].numpy()[0]) == 2.0
        return keys

    first = step()
    before = rt.counters()
    for _ in range(3):
        assert step() == first
    after = rt.counters()
    assert after["device_allocs"] == before["device_allocs"] and after["pool_bytes"] == before["pool_bytes"]
    assert after["pool_regions"] == before["pool_regions"]
