"""The device layer's queries through a fake Vulkan binding (the binding is an argument: the narrow seam), and the
local rank handed to it by a call (select_device), not an environment variable."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import helios.device as device
from helios.device import DeviceError, cooperative_matrix_shapes
from helios.errors import SetupError

NULL = object()


class FakeFFI:
    """Just what cooperative_matrix_shapes asks of cffi: cast, typeof, new, NULL and the type error class."""

    error = type("error", (Exception,), {})
    NULL = NULL

    def __init__(self, fn, known_types=True):
        self.fn, self.known_types = fn, known_types

    def cast(self, ctype, pointer):
        if not self.known_types:
            raise self.error(f"unknown type {ctype}")
        return self.fn

    def typeof(self, ctype):
        if not self.known_types:
            raise self.error(f"unknown type {ctype}")
        return ctype

    def new(self, ctype, n=None):
        if ctype == "uint32_t*":
            return [0]
        return [SimpleNamespace() for _ in range(n)]


def binding(fn, known_types=True, stype=True):
    lib = SimpleNamespace(vkGetInstanceProcAddr=lambda instance, name: name)
    vk = SimpleNamespace(lib=lib)
    if stype:
        vk.VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR = 1000506001
    return vk, FakeFFI(fn, known_types)


def one_shape(phys, count, props):
    """A query listing one subgroup 16x16x16 f16 x f16 -> f32 shape, as a driver answers."""
    if props is NULL:
        count[0] = 1
    else:
        props[0].__dict__.update(MSize=16, NSize=16, KSize=16, AType=0, BType=0, CType=1, ResultType=1, scope=3)
    return 0


def test_a_working_query_lists_its_shapes():
    vk, ffi = binding(one_shape)
    assert cooperative_matrix_shapes(vk, ffi, "instance", "phys") == ((16, 16, 16, "f16", "f16", "f32", "f32"),)


@pytest.mark.parametrize("vk_ffi", [
    lambda: binding(NULL),  # the loader has no such function
    lambda: binding(one_shape, known_types=False),  # a binding without the extension's types
    lambda: binding(one_shape, stype=False),  # or without its structure type
], ids=["no function", "no types", "no sType"])
def test_a_query_that_is_not_there_means_no_matrix_units(vk_ffi):
    vk, ffi = vk_ffi()
    assert cooperative_matrix_shapes(vk, ffi, "instance", "phys") == ()


def test_an_unexpected_failure_of_the_query_is_loud():
    def broken(phys, count, props):
        raise TypeError("initializer for ctype 'uint32_t *' must be a cdata pointer")

    vk, ffi = binding(broken)
    with pytest.raises(DeviceError, match="vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR.*TypeError"):
        cooperative_matrix_shapes(vk, ffi, "instance", "phys")


def test_a_query_the_driver_fails_is_loud():
    vk, ffi = binding(lambda phys, count, props: -1)  # VK_ERROR_OUT_OF_HOST_MEMORY
    with pytest.raises(DeviceError, match="vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR.*VkResult -1"):
        cooperative_matrix_shapes(vk, ffi, "instance", "phys")


def test_the_local_rank_is_placed_by_a_call_before_the_device_exists():
    dev = device.get_device()
    device.select_device(local_rank=dev.local_rank)  # the same placement again: nothing to change
    with pytest.raises(SetupError, match="before the first device use"):
        device.select_device(local_rank=dev.local_rank + 1)
