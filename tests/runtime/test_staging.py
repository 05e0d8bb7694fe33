"""The staging path of discrete GPUs, forced on this device: ordering of uploads, kernels and downloads.

Regression for stale reads seen on an H100 (about 1 in 10 round trips at 16929 or 16931 floats returned
an older tensor's data): the device and staging pools numbered their regions from 1 each, and hazard
tracking is keyed by region, so reusing a staging region erased the pending write of the device region
with the same number and the download copy ran without a barrier after the kernel. lavapipe executes
commands one at a time and never shows that race, so these tests check the synchronisation itself with
an independent shadow account (tests/runtime/hazards.py) as well as the results.
"""

from __future__ import annotations

import numpy as np
import pytest

from helios import runtime as rt
from helios.runtime import recorder as recorder_module
from tests.runtime.hazards import HazardShadow
from tests.runtime.kernels import ADD, AXPB, groups

SIZES = (16929, 16931, 16928, 4097, 40001, 7, 1000)


def _staging(private_runtime):
    r = private_runtime(zero_copy=False)
    assert r.staging is not None
    return r, HazardShadow(r)


def _round_trips(rng, rounds: int) -> int:
    """from_numpy -> kernel -> numpy at mixed sizes, with uploads, launches and reads interleaved."""
    checked = 0
    for _ in range(rounds):
        for n in SIZES:
            a = rng.standard_normal(n).astype(np.float32)
            b = rng.standard_normal(n).astype(np.float32)
            ta, tb = rt.from_numpy(a), rt.from_numpy(b)
            out, neg = rt.empty(n), rt.empty(n)
            rt.launch(ADD, [ta, tb, out], {"n": n}, groups(n))
            np.testing.assert_array_equal(out.numpy(), a + b)
            rt.launch(AXPB, [ta, neg], {"n": n, "a": -1.0, "c": 0.0}, groups(n))
            tc = rt.from_numpy(b[::-1].copy())  # an upload recorded behind the kernel, before the read
            np.testing.assert_array_equal(neg.numpy(), -a)
            np.testing.assert_array_equal(tc.numpy(), b[::-1])
            np.testing.assert_array_equal(ta.numpy(), a)  # untouched by the open batch: a side copy
            checked += 4
    return checked


def test_staging_round_trips_at_mixed_sizes_are_exact_and_synchronised(private_runtime):
    r, shadow = _staging(private_runtime)
    assert _round_trips(np.random.default_rng(0), 4) == 4 * 4 * len(SIZES)
    assert shadow.commands > 100
    assert shadow.errors == []


def test_region_keys_are_unique_across_the_device_and_staging_pools(private_runtime):
    r, _ = _staging(private_runtime)
    held = [rt.from_numpy(np.ones(n, np.float32)) for n in SIZES]
    rt.sync()  # the uploads' staging regions are free again: these reuse them
    stages = [r.staging.acquire(4 * n) for n in SIZES]
    device_keys = {t.storage.key for t in held}
    assert len(device_keys) == len(SIZES)
    assert device_keys.isdisjoint(s.key for s in stages)


def test_download_of_a_kernel_result_waits_behind_a_barrier(private_runtime):
    # The sequence that used to hand the download a staging region numbered like the kernel's output.
    r, shadow = _staging(private_runtime)
    n = 16929
    a = np.arange(n, dtype=np.float32)
    x, x2 = rt.from_numpy(a), rt.from_numpy(a)
    rt.sync()
    del x2
    out = rt.empty(n)
    rt.launch(AXPB, [x, out], {"n": n, "a": -1.0, "c": 0.0}, groups(n))
    before = rt.counters()["barriers"]
    np.testing.assert_array_equal(out.numpy(), -a)
    assert rt.counters()["barriers"] == before + 1  # between the kernel's write and the copy that reads it
    assert shadow.errors == []


def test_the_shadow_sees_a_missing_barrier(private_runtime, monkeypatch):
    # Without this, a shadow that checks nothing would pass the tests above.
    r, shadow = _staging(private_runtime)
    monkeypatch.setattr(recorder_module, "overlaps", lambda ranges, lo, hi: False)
    x = rt.from_numpy(np.ones(64, np.float32))
    y = rt.empty(64)
    rt.launch(AXPB, [x, y], {"n": 64, "a": 2.0, "c": 0.0}, 1)
    y.numpy()
    assert any("read-after-write" in e for e in shadow.errors), shadow.errors


@pytest.mark.parametrize("zero_copy", [True, False])
def test_steps_with_pool_reuse_are_synchronised(private_runtime, zero_copy):
    """Tensors freed and reallocated across batches: every reuse waits for the device, every hazard has a barrier."""
    r = private_runtime(zero_copy=zero_copy)
    shadow = HazardShadow(r)
    n = 4097
    w0 = (np.arange(n) % 7).astype(np.float32)
    w = rt.from_numpy(w0)
    for step in range(6):
        acts = [rt.empty(n) for _ in range(3)]
        rt.launch(AXPB, [w, acts[0]], {"n": n, "a": 1.0, "c": 1.0}, groups(n))  # w + 1
        rt.launch(ADD, [acts[0], w, acts[1]], {"n": n}, groups(n))  # 2w + 1
        rt.launch(AXPB, [acts[1], acts[2]], {"n": n, "a": 1.0, "c": 0.0}, groups(n))
        rt.launch(AXPB, [acts[2], w], {"n": n, "a": 1.0, "c": 0.0}, groups(n))
        if step % 2:
            rt.flush()  # the next step's allocations meet regions of a submitted, maybe unfinished batch
        del acts
    np.testing.assert_array_equal(w.numpy(), (w0 + 1) * 64 - 1)  # w -> 2w + 1, six times
    assert shadow.commands >= 24 and shadow.errors == []
