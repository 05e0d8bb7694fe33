"""Tensors: round trips, constructors, views, reshape, release, and the errors they give."""

from __future__ import annotations

import numpy as np
import pytest

from helios import runtime as rt
from helios.errors import HeliosError
from tests.conftest import aligned, dtype_params, needs


@pytest.mark.parametrize("dtype", dtype_params(np.float32, np.int32, np.uint32, np.float16))
@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 5), (2, 3, 4), (0,), (1000,)])
def test_round_trip(runtime, dtype, shape):
    a = (np.arange(int(np.prod(shape))) % 250).astype(dtype).reshape(shape)
    t = rt.from_numpy(a)
    assert t.shape == shape and t.dtype == np.dtype(dtype) and t.numel == a.size and t.nbytes == a.nbytes
    out = t.numpy()
    assert out.dtype == np.dtype(dtype) and out.shape == shape
    np.testing.assert_array_equal(out, a)


def test_numpy_defaults_are_narrowed(runtime):
    assert rt.from_numpy(np.arange(5)).dtype == np.int32
    assert rt.from_numpy(np.ones(3)).dtype == np.float32
    with pytest.raises(HeliosError, match="do not fit"):
        rt.from_numpy(np.array([2**40]))
    with pytest.raises(HeliosError, match="not supported"):
        rt.from_numpy(np.zeros(3, dtype=np.complex64))


@pytest.mark.parametrize("dtype", dtype_params(np.float32, np.int32, np.uint32, np.float16))
def test_zeros_and_full(runtime, dtype):
    np.testing.assert_array_equal(rt.zeros((4, 3), dtype).numpy(), np.zeros((4, 3), dtype))
    for n in (1, 5, 6, 257):  # odd float16 counts pad into the region's tail
        np.testing.assert_array_equal(rt.full(n, 3, dtype).numpy(), np.full(n, 3, dtype))
    assert rt.counters()["fills"] >= 5


def test_full_float_values(runtime):
    np.testing.assert_array_equal(rt.full(9, -1.5).numpy(), np.full(9, -1.5, np.float32))
    needs(dtype=np.float16)
    np.testing.assert_array_equal(rt.full(3, -1.5, np.float16).numpy(), np.full(3, -1.5, np.float16))


@pytest.mark.needs(dtype=np.float16)
def test_odd_float16_view_fill_is_refused(runtime):
    arena = rt.zeros(64, np.float16)
    with pytest.raises(HeliosError, match="odd number"):
        rt.fill(arena.view(0, 3), 1.0)


def test_views_share_memory_and_respect_alignment(runtime):
    align = runtime.info.min_storage_buffer_offset_alignment
    step = max(1, align // 4)
    arena = rt.from_numpy(np.arange(8 * step, dtype=np.float32))
    v = arena.view(2 * step, (2, step))
    np.testing.assert_array_equal(v.numpy().ravel(), np.arange(2 * step, 4 * step, dtype=np.float32))
    rt.fill(v, 7.0)
    expect = np.arange(8 * step, dtype=np.float32)
    expect[2 * step:4 * step] = 7
    np.testing.assert_array_equal(arena.numpy(), expect)
    if step > 1:
        with pytest.raises(HeliosError, match="minStorageBufferOffsetAlignment"):
            arena.view(1, 4)
    with pytest.raises(HeliosError, match="does not fit"):
        arena.view(7 * step, 2 * step)


def test_reshape(runtime):
    t = rt.from_numpy(np.arange(12, dtype=np.float32))
    r = t.reshape(3, -1)
    assert r.shape == (3, 4)
    np.testing.assert_array_equal(r.numpy(), np.arange(12, dtype=np.float32).reshape(3, 4))
    assert t.reshape((2, 6)).shape == (2, 6)
    with pytest.raises(HeliosError):
        t.reshape(5, -1)


def test_copy(runtime):
    a = rt.from_numpy(np.arange(10, dtype=np.float32))
    b = rt.empty(10)
    rt.copy(a, b)
    np.testing.assert_array_equal(b.numpy(), np.arange(10, dtype=np.float32))
    with pytest.raises(HeliosError, match="bytes"):
        rt.copy(a, rt.empty(3))


def test_release_returns_region_to_pool(runtime):
    t = rt.empty(1000)
    in_use = rt.counters()["pool_in_use"]
    key = t.storage.key
    t.release()
    assert rt.counters()["pool_in_use"] < in_use
    assert "released" in repr(t)
    with pytest.raises(HeliosError, match="released"):
        t.numpy()
    assert rt.empty(1000).storage.key == key  # never used by the device: reusable at once


def test_view_keeps_memory_alive(runtime):
    at = aligned(16)  # 16 where the device allows it
    t = rt.from_numpy(np.arange(at + 48, dtype=np.float32))
    v = t.view(at, 16)
    key = t.storage.key
    t.release()
    del t
    other = rt.empty(at + 48)
    assert other.storage.key != key
    np.testing.assert_array_equal(v.numpy(), np.arange(at, at + 16, dtype=np.float32))


def test_tensor_too_large_for_one_binding(runtime):
    limit = min(runtime.info.max_storage_buffer_range, runtime.info.max_memory_allocation_size)
    with pytest.raises(HeliosError, match="maxStorageBufferRange"):
        rt.empty(limit // 4 + 1)


def test_size_classes():
    from helios.runtime.memory import size_class

    assert size_class(1) == 256 and size_class(256) == 256 and size_class(257) == 512
    assert size_class(1025) == 1280 and size_class(4096) == 4096 and size_class(4097) == 5120
    for n in range(1, 1 << 22, 997):
        c = size_class(n)
        assert n <= c <= max(256, n * 1.25 + 256) and c % 256 == 0
