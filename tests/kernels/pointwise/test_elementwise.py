"""Elementwise maps beyond their op specs (whose derived tests, tests/kernels/test_opspecs.py, run add, sub, mul,
div with row and column broadcasts, scale, neg, masked_fill with an int32 mask and add_inplace in every dtype and
forced access): variant choice, broadcast shapes and their errors, out= into a view, clone (a copy command, no
kernel), float and uint32 masks (-0.0 is zero), add_inplace allocating nothing, the 2-D grid, one large map and an
empty one.
"""

from __future__ import annotations

import numpy as np
import pytest

import helios.runtime as rt
from helios.kernels.contract import selection
from helios.kernels.lib import maps
from helios.kernels.pointwise import elementwise as E

# awkward sizes: rows of 1, 7, 33, 513; columns not a multiple of 4 or of the workgroup
SHAPES = [(1,), (7,), (1, 4097), (7, 33), (33, 513), (513, 12), (3, 5, 8)]


def test_variant_choice(force):
    def choose(n, bcast="full", cols=0, dtype="f32"):
        return selection.choose("elementwise", (n, bcast, cols), dtype)

    force("elementwise", "u64x2")
    assert choose(4096) == "u64x2"
    assert choose(4097) == "vec4"  # u64x2 has no scalar tail
    assert choose(3) == "scalar"
    assert choose(33 * 12, "row", 12) == "row_u64x2"
    assert choose(33 * 13, "col", 13) == "col_scalar"
    assert choose(4096, dtype="bf16") == "bf16_u64x2"
    force("elementwise", None)
    info = rt.get_runtime().info  # 64-bit loads only where the device has shaderInt64
    assert choose(4096) == ("u64x2" if info.cpu_profile and info.int64 else "vec4")
    with pytest.raises(ValueError, match="unknown elementwise choice 'vec8'"):
        force("elementwise", "vec8")


def test_broadcast_shapes_and_errors():
    a = rt.zeros((4, 6))
    assert maps.broadcast_mode(a, rt.zeros((6,))) == ("row", 6)
    assert maps.broadcast_mode(a, rt.zeros((1, 6))) == ("row", 6)
    assert maps.broadcast_mode(a, rt.zeros((4, 1))) == ("col", 6)
    assert maps.broadcast_mode(a, rt.zeros((4, 6))) == ("full", 6)
    with pytest.raises(ValueError, match="cannot broadcast"):
        E.add(a, rt.zeros((4,)))
    with pytest.raises(ValueError, match="cannot broadcast"):
        E.add(a, rt.zeros((6, 4)))


def test_out_argument_writes_into_a_view(access):
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((2, 9)).astype(np.float32), rng.standard_normal((2, 9)).astype(np.float32)
    at = max(16, rt.get_runtime().info.min_storage_buffer_offset_alignment // 4)  # a legal descriptor offset
    arena = rt.zeros(at + 48)
    view = arena.view(at, (2, 9))
    got = E.add(rt.from_numpy(a), rt.from_numpy(b), out=view)
    assert got is view
    full = arena.numpy()
    np.testing.assert_array_equal(full[at:at + 18].reshape(2, 9), a + b)
    assert not full[:at].any() and not full[at + 18:].any()  # nothing outside the view written


def test_clone_copies_every_shape():
    rng = np.random.default_rng(3)
    for shape in SHAPES:
        x = rng.standard_normal(shape).astype(np.float32)
        xt = rt.from_numpy(x)
        y = E.clone(xt)
        assert y is not xt and y.shape == shape
        np.testing.assert_array_equal(y.numpy(), x)


def test_float_and_uint32_masks(access):
    """A float mask is read as bits with the sign cleared (so -0.0 does not fill, 0.5 does); a uint32 mask as
    words (0x80000000 fills). The int32 mask is the op spec's."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((33, 8)).astype(np.float32)
    for mask_dtype in (np.float32, np.uint32):
        mask = (rng.random((33, 8)) < 0.4).astype(mask_dtype)
        if mask_dtype == np.float32:
            mask[0, :3] = -0.0  # negative zero is zero: not filled
            mask[1, :3] = 0.5
        else:
            mask[0, :3] = 0x80000000
        got = E.masked_fill(rt.from_numpy(x), rt.from_numpy(mask), -1e9).numpy()
        np.testing.assert_array_equal(got, E.reference_masked_fill(x, mask, -1e9))


def test_add_inplace_allocates_nothing():
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(4099).astype(np.float32), rng.standard_normal(4099).astype(np.float32)
    at, bt = rt.from_numpy(a), rt.from_numpy(b)
    rt.sync()
    before = rt.counters()["pool_in_use"]
    assert E.add_inplace(at, bt, alpha=-0.5) is at
    assert rt.counters()["pool_in_use"] == before
    np.testing.assert_array_equal(at.numpy(), a + np.float32(-0.5) * b)


def test_2d_grid_logic(monkeypatch, access):
    """With at most 3 workgroups in x, 5000 work items need a 3 x 7 grid; every element is covered once."""
    monkeypatch.setattr(maps, "MAX_GROUPS", (3, 65535))
    n = {"scalar": 5000, "vec4": 4 * 4997 + 3, "u64x2": 4 * 5000}[access]
    variant = selection.choose("elementwise", (n, "full", 0))
    assert variant == access
    assert maps.grid_2d(maps.work_items(n, E.ADD.variant(variant).vec)) == (3, 7, 1)
    x = np.arange(n, dtype=np.float32)
    got = E.add(rt.from_numpy(x), rt.from_numpy(np.ones(n, np.float32))).numpy()
    np.testing.assert_array_equal(got, x + 1)
    monkeypatch.setattr(maps, "MAX_GROUPS", (3, 3))
    with pytest.raises(ValueError, match="exceed"):
        maps.grid_2d(256 * 10)


def test_grid_limits_for_huge_sizes(monkeypatch):
    monkeypatch.setattr(maps, "MAX_GROUPS", (65535, 65535))
    for items in (1, 256, 65535 * 256, 65535 * 256 + 1, 2**32 - 1):
        gx, gy, gz = maps.grid_2d(items)
        assert gx <= 65535 and gy <= 65535 and gz == 1
        assert gx * gy * 256 >= items


def test_five_million_elements_with_tail():
    """One large map (~5M elements, n % 4 == 3) in the default vec4 variant: a few seconds at most on lavapipe."""
    n = 5_000_003
    a = np.arange(n, dtype=np.float32)
    got = E.add(rt.from_numpy(a), rt.from_numpy(a)).numpy()
    np.testing.assert_array_equal(got, a + a)


def test_empty_tensor():
    x = rt.empty((0, 4))
    assert E.add(x, x).shape == (0, 4)
