"""Buffers read and written through device addresses (`b.buffer(..., addressed=True)`): the runtime pushes
each bound tensor's address (views at an offset included), loads and stores go through PhysicalStorageBuffer
pointers with their alignment, scalar, vec4, 64-bit and bf16 views agree with numpy at awkward sizes, a
divergent gather reads what a descriptor-bound buffer reads, and every variant passes spirv-val."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from helios import runtime as rt
from helios.errors import HeliosError
from helios.spirv import Kernel, bf16, ceil_div, f32, u32, u64, vec
from tests.conftest import needs
from tests.spirv_val import spirv_cases

SIZES = (1, 7, 33, 513, 4097)


def _affine(b, v):
    """y = x * 3 + 1 (addressed or descriptor-bound), through the variant's view of the buffers."""
    b.local_size(64)
    dtype = bf16 if v.view == "bf16" else f32
    x, y = b.buffer(0, dtype, "r", v.addressed), b.buffer(1, dtype, "w", v.addressed)
    n = b.push("n", u32)
    i = b.global_index()
    if v.view in ("f32", "bf16"):
        with b.if_(i < n):
            y[i] = x[i] * 3.0 + 1.0
    elif v.view == "vec4":
        with b.if_(i < n / 4):
            y.vec4[i] = x.vec4[i] * 3.0 + 1.0
    else:  # "u64x2": four floats moved as two 64-bit words
        words_in, words_out = x.view_as(vec(u64, 2)), y.view_as(vec(u64, 2))
        with b.if_(i < n / 4):
            words_out[i] = b.bitcast(b.bitcast(words_in[i], vec(f32, 4)) * 3.0 + 1.0, vec(u64, 2))


def _gather(b, v):
    """out[i] = x[(i * 37) % n]: every invocation reads an address of its own."""
    b.local_size(64)
    x, out = b.buffer(0, f32, "r", v.addressed), b.buffer(1, f32, "w", v.addressed)
    n = b.push("n", u32)
    i = b.global_index()
    with b.if_(i < n):
        out[i] = x[(i * 37) % n]


VIEWS = ("f32", "vec4", "u64x2", "bf16")
AFFINE = Kernel("test_addressed_affine", _affine, register=False,
                variants={f"{view}_{kind}": {"view": view, "addressed": kind == "addr"}
                          for view in VIEWS for kind in ("addr", "desc")})
GATHER = Kernel("test_addressed_gather", _gather, register=False,
                variants={"addr": {"addressed": True}, "desc": {"addressed": False}})


def _needs_addresses():
    needs("buffer_device_address")


@pytest.mark.parametrize("kernel,variant", spirv_cases([AFFINE, GATHER]))
def test_spirv_valid(kernel, variant, spirv_val):
    spirv_val.check(kernel, variant)
    module = kernel.module(variant)
    assert ("PhysicalStorageBufferAddresses" in module.capabilities) == kernel.variant(variant).addressed
    assert module.addressed == ((0, 1) if kernel.variant(variant).addressed else ())
    assert {f.name for f in module.push_fields} >= ({"addr0_lo", "addr0_hi", "addr1_lo", "addr1_hi"}
                                                    if module.addressed else {"n"})


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("view", VIEWS)
def test_addressed_views_match_numpy(view, n):
    _needs_addresses()
    if view in ("vec4", "u64x2"):
        n = max(4, n - n % 4)
    host_dtype = ml_dtypes.bfloat16 if view == "bf16" else np.float32
    x = (np.random.default_rng(n).standard_normal(n) * 4).astype(host_dtype)
    want = (x.astype(np.float32) * 3 + 1).astype(host_dtype)
    for kind in ("addr", "desc"):
        y = rt.empty(n, host_dtype)
        items = n if view in ("f32", "bf16") else n // 4
        rt.launch(AFFINE, [rt.from_numpy(x), y], push={"n": n}, grid=(ceil_div(items, 64), 1, 1),
                  variant=f"{view}_{kind}")
        np.testing.assert_array_equal(y.numpy().view(np.uint8), want.view(np.uint8), err_msg=kind)


def test_addresses_of_views_at_an_offset():
    """A view's address is its region's plus its own offset: the kernel sees exactly the viewed elements."""
    _needs_addresses()
    align = rt.get_runtime().info.min_storage_buffer_offset_alignment // 4
    x = np.arange(3 * align + 33, dtype=np.float32)
    src, dst = rt.from_numpy(x), rt.zeros(3 * align + 33)
    rt.launch(AFFINE, [src.view(align, 33), dst.view(2 * align, 33)], push={"n": 33}, grid=(1, 1, 1),
              variant="f32_addr")
    got = dst.numpy()
    np.testing.assert_array_equal(got[2 * align:2 * align + 33], x[align:align + 33] * 3 + 1)
    assert not got[:2 * align].any() and not got[2 * align + 33:].any()


@pytest.mark.parametrize("n", SIZES)
def test_gather_through_addresses_matches_descriptors(n):
    _needs_addresses()
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    outs = {}
    for kind in ("addr", "desc"):
        out = rt.empty(n)
        rt.launch(GATHER, [rt.from_numpy(x), out], push={"n": n}, grid=(ceil_div(n, 64), 1, 1), variant=kind)
        outs[kind] = out.numpy()
    np.testing.assert_array_equal(outs["addr"], x[(np.arange(n) * 37) % n])
    np.testing.assert_array_equal(outs["addr"], outs["desc"])


@pytest.mark.needs("buffer_device_address")  # else the device contract refuses the module first
def test_a_tensor_without_an_address_is_refused(monkeypatch):
    """A pool without the device-address usage gives address 0: the launch says so instead of crashing."""
    x, y = rt.zeros(8), rt.zeros(8)
    monkeypatch.setattr(type(x), "address", property(lambda self: 0))
    with pytest.raises(HeliosError, match="device address"):
        rt.launch(AFFINE, [x, y], push={"n": 8}, grid=(1, 1, 1), variant="f32_addr")
