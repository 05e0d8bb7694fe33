"""The device contract: what a kernel module needs, checked against what the device offers, before any driver
sees the module.

A module states its needs in its interface (helios.spirv.ShaderModule): the SPIR-V capabilities and extensions
it declares, its workgroup size and shared memory (both may be set by specialization constants), its
push-constant bytes and how many storage buffers it binds (against the per-stage and per-set descriptor limits,
and maxPushDescriptors where the runtime binds through push descriptors). `check` compares them with the
DeviceInfo's features and limits and raises DeviceContractError naming the kernel, the need and the device's
figure. A driver given a module that declares what it does not offer may compute garbage or crash (SwiftShader
segfaults on Int64); helios never gives it one.
The bytes a dispatch binds are the runtime's side of the contract: a tensor larger than maxStorageBufferRange
is refused when it is made (TensorTooLargeError) and a view off minStorageBufferOffsetAlignment when it is taken.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from helios.errors import HeliosError

# SPIR-V capability -> (what a device must offer, the DeviceInfo test). Capabilities every Vulkan compute device
# has (Shader) are free; a capability missing here is refused, since nobody has said what it needs.
_SUBGROUP = {"GroupNonUniform": "basic", "GroupNonUniformVote": "vote", "GroupNonUniformArithmetic": "arithmetic",
             "GroupNonUniformBallot": "ballot", "GroupNonUniformShuffle": "shuffle",
             "GroupNonUniformShuffleRelative": "shuffle_relative", "GroupNonUniformClustered": "clustered",
             "GroupNonUniformQuad": "quad"}


def _feature(name: str, vulkan: str) -> tuple[str, Callable[[Any], bool]]:
    return vulkan, lambda info: bool(getattr(info, name))


def _native_coopmat(info) -> bool:
    return bool(info.cooperative_matrix) and not info.cooperative_matrix_emulated


def _native_bf16_coopmat(info) -> bool:
    return _native_coopmat(info) and any("bf16" in shape[3:] for shape in info.cooperative_matrix)


CAPABILITIES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "Shader": ("Vulkan compute", lambda info: True),
    "Int64": _feature("int64", "shaderInt64"),
    "Int16": _feature("int16", "shaderInt16"),
    "Float16": _feature("float16", "shaderFloat16"),
    "Float64": _feature("float64", "shaderFloat64"),
    "StorageBuffer16BitAccess": _feature("storage_16bit", "storageBuffer16BitAccess"),
    "StorageBuffer8BitAccess": _feature("storage_8bit", "storageBuffer8BitAccess"),
    "VulkanMemoryModel": _feature("vulkan_memory_model", "vulkanMemoryModel"),
    "PhysicalStorageBufferAddresses": _feature("buffer_device_address", "bufferDeviceAddress"),
    # helios adds floats atomically into storage buffers only (the embedding's "atomic" scatter).
    "AtomicFloat32AddEXT": _feature("float_atomic_add_buffer", "shaderBufferFloat32AtomicAdd"),
    "CooperativeMatrixKHR": ("VK_KHR_cooperative_matrix", _native_coopmat),
    "BFloat16TypeKHR": ("bfloat16 cooperative matrices", _native_bf16_coopmat),
    "BFloat16CooperativeMatrixKHR": ("bfloat16 cooperative matrices", _native_bf16_coopmat),
    **{cap: (f"subgroup operations '{op}'", lambda info, op=op: op in info.subgroup_ops)
       for cap, op in _SUBGROUP.items()},
}
EXTENSIONS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "SPV_KHR_cooperative_matrix": CAPABILITIES["CooperativeMatrixKHR"],
    "SPV_KHR_bfloat16": CAPABILITIES["BFloat16TypeKHR"],
    "SPV_EXT_shader_atomic_float_add": CAPABILITIES["AtomicFloat32AddEXT"],
}


class DeviceContractError(HeliosError):
    """A kernel needs what the device does not offer; raised before the driver sees the module."""

    exit_code = 2


def unmet_needs(module, info, spec: Mapping[str, int | float] | None = None) -> list[str]:
    """Each need of `module` (with specialization constants `spec`) that `info` does not meet, as a phrase
    naming the need and the device's figure; [] when the device can run it."""
    unmet = []
    for kind, table, names in (("capability", CAPABILITIES, module.capabilities),
                               ("extension", EXTENSIONS, module.extensions)):
        for name in names:
            need = table.get(name)
            if need is None:
                unmet.append(f"SPIR-V {kind} {name}, which helios does not know how to check on a device")
            elif not need[1](info):
                unmet.append(f"SPIR-V {kind} {name} (needs {need[0]}, which this device does not offer)")
    size = module.local_size_for(spec)
    invocations = size[0] * size[1] * size[2]
    if invocations > info.max_workgroup_invocations:
        unmet.append(f"{invocations} invocations per workgroup {size} (maxComputeWorkGroupInvocations "
                     f"{info.max_workgroup_invocations})")
    for axis, (want, most) in enumerate(zip(size, info.max_workgroup_size, strict=True)):
        if want > most:
            unmet.append(f"workgroup size {want} along {'xyz'[axis]} (maxComputeWorkGroupSize {most})")
    shared = module.shared_bytes_for(spec)
    if shared > info.max_shared_memory:
        unmet.append(f"{shared} bytes of shared memory (maxComputeSharedMemorySize {info.max_shared_memory})")
    if module.push_size > info.max_push_constants_size:
        unmet.append(f"{module.push_size} bytes of push constants (maxPushConstantsSize "
                     f"{info.max_push_constants_size})")
    buffers = len(module.bindings)
    for limit, most in binding_limits(info):
        if buffers > most:
            unmet.append(f"{buffers} storage-buffer bindings ({limit} {most})")
    return unmet


def binding_limits(info) -> list[tuple[str, int]]:
    """(Vulkan limit, figure) of each bound on the storage buffers one pipeline binds: its one descriptor set's
    per-stage and per-set limits, and maxPushDescriptors where the runtime pushes them (info.push_descriptor)."""
    limits = [("maxPerStageDescriptorStorageBuffers", info.max_per_stage_storage_buffers),
              ("maxPerStageResources", info.max_per_stage_resources),
              ("maxDescriptorSetStorageBuffers", info.max_set_storage_buffers)]
    if info.push_descriptor:
        limits.append(("maxPushDescriptors", info.max_push_descriptors))
    return limits


def fits(module, info, spec: Mapping[str, int | float] | None = None) -> bool:
    """Whether the device described by `info` can run `module` with `spec`."""
    return not unmet_needs(module, info, spec)


def check(module, info, spec: Mapping[str, int | float] | None = None) -> None:
    """Raise DeviceContractError if `info`'s device cannot run `module` with `spec`."""
    unmet = unmet_needs(module, info, spec)
    if unmet:
        label = f"{module.name}:{module.variant}" if getattr(module, "variant", None) else module.name
        raise DeviceContractError(
            f"kernel {label} cannot run on {info.name}: it needs " + "; ".join(unmet)
            + ". helios refused it before the driver saw it; a selection rule that chose it should choose a "
            "variant that fits (python -m helios info lists what this device offers)")


__all__ = ["CAPABILITIES", "EXTENSIONS", "DeviceContractError", "binding_limits", "check", "fits", "unmet_needs"]
