"""The device contract (helios/runtime/contract.py): a module's needs against a DeviceInfo, refused with the kernel,
the need and the device's figure named, before any Vulkan object is made from the module. Devices that lack a
feature are the running device's DeviceInfo with it taken away (a clamp only removes), so every case runs here."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from helios.runtime import contract
from helios.runtime.contract import DeviceContractError
from helios.runtime.pipelines import PipelineCache
from helios.spirv import Kernel, KernelBuilder, Variant, f32, u32, u64


def _build_u64_copy(b: KernelBuilder, v: Variant) -> None:
    """Copies 64-bit words: declares Int64."""
    b.local_size(64)
    x, y = b.buffer(0, u64, "r"), b.buffer(1, u64, "w")
    i = b.global_id(0)
    with b.if_(i < b.push("n", u32)):
        y[i] = x[i]


def _build_shared(b: KernelBuilder, v: Variant) -> None:
    """A workgroup array of v.floats floats (or as many as the spec constant FLOATS says) and v.wg invocations."""
    b.local_size(v.wg)
    length = b.spec("FLOATS", u32, v.floats) if v.get("spec") else v.floats
    tile = b.shared(f32, length)
    y = b.buffer(0, f32, "w")
    i = b.local_id(0)
    tile[i] = b.cast(i, f32)
    b.barrier()
    y[i] = tile[i]


U64_COPY = Kernel("contract_u64_copy", _build_u64_copy, register=False)
SHARED = Kernel("contract_shared", _build_shared, register=False, variants={
    "16k": {"floats": 4096, "wg": 64}, "24k": {"floats": 6144, "wg": 64},
    "spec": {"floats": 1024, "wg": 64, "spec": True}, "wide": {"floats": 64, "wg": 512}})


@pytest.fixture
def info(device):
    return device.info


def test_a_capability_the_device_lacks_is_refused_naming_kernel_and_feature(info):
    module = U64_COPY.module()
    assert "Int64" in module.capabilities
    contract.check(module, dataclasses.replace(info, int64=True))  # negative control: offered, accepted
    with pytest.raises(DeviceContractError, match=r"contract_u64_copy.*Int64.*shaderInt64"):
        contract.check(module, dataclasses.replace(info, int64=False))


def test_shared_memory_counts_arrays_and_spec_constants(info):
    small = dataclasses.replace(info, max_shared_memory=16384)
    contract.check(SHARED.module("16k"), small)  # exactly the limit fits
    with pytest.raises(DeviceContractError, match=r"contract_shared:24k.*24576 bytes of shared memory.*16384"):
        contract.check(SHARED.module("24k"), small)
    spec = SHARED.module("spec")
    assert spec.shared_bytes_for() == 4096 and spec.shared_bytes_for({"FLOATS": 8192}) == 32768
    contract.check(spec, small, {"FLOATS": 4096})
    with pytest.raises(DeviceContractError, match="32768 bytes"):
        contract.check(spec, small, {"FLOATS": 8192})


def test_workgroup_size_and_push_constants_against_the_limits(info):
    few = dataclasses.replace(info, max_workgroup_invocations=256, max_workgroup_size=(256, 256, 64))
    with pytest.raises(DeviceContractError, match=r"512 invocations.*maxComputeWorkGroupInvocations 256"):
        contract.check(SHARED.module("wide"), few)
    assert any("maxComputeWorkGroupSize 256" in n for n in contract.unmet_needs(SHARED.module("wide"), few))
    tight = dataclasses.replace(info, max_push_constants_size=2)
    with pytest.raises(DeviceContractError, match=r"4 bytes of push constants.*maxPushConstantsSize 2"):
        contract.check(U64_COPY.module(), tight)


def test_the_pipeline_cache_refuses_before_making_a_shader_module(device):
    """The same Vulkan device, described without int64: get() raises, and no VkShaderModule was created."""
    without = SimpleNamespace(info=dataclasses.replace(device.info, int64=False), vk=device.vk, ffi=device.ffi,
                              device=device.device, physical=device.physical)
    cache = PipelineCache(without, push_descriptors=False, persist=False)
    try:
        with pytest.raises(DeviceContractError, match="contract_u64_copy"):
            cache.get(U64_COPY.module())
        assert not cache._shader_modules and len(cache) == 0
    finally:
        cache.close()


def test_storage_buffer_bindings_against_the_descriptor_limits(info):
    """decode_block binds 18 storage buffers (more than Vulkan's guaranteed 4 per stage): a device allowing 16 per
    stage, per set or per push refuses it naming the count and the limit; the running device takes it."""
    from helios.kernels.decode.block import DECODE_BLOCK

    module = DECODE_BLOCK.module("plain")
    assert len(module.bindings) == 18
    assert not [n for n in contract.unmet_needs(module, info) if "storage-buffer" in n]  # negative control
    for limit, field in (("maxPerStageDescriptorStorageBuffers", "max_per_stage_storage_buffers"),
                         ("maxPerStageResources", "max_per_stage_resources"),
                         ("maxDescriptorSetStorageBuffers", "max_set_storage_buffers")):
        contract.check(module, dataclasses.replace(info, **{field: 18}))  # exactly the limit fits
        refused = rf"decode_block:plain.*18 storage-buffer bindings \({limit} 16\)"
        with pytest.raises(DeviceContractError, match=refused):
            contract.check(module, dataclasses.replace(info, **{field: 16}))
    pushed = dataclasses.replace(info, push_descriptor=True, max_push_descriptors=16)
    assert contract.unmet_needs(module, pushed) == ["18 storage-buffer bindings (maxPushDescriptors 16)"]
    # Without push descriptors the runtime allocates descriptor sets: maxPushDescriptors does not bind it.
    assert contract.fits(module, dataclasses.replace(pushed, push_descriptor=False))
