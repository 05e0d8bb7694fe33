"""Device policy: what helios chooses for a device from its DeviceInfo alone (features and limits, no kernel
internals). `auto_dtype(info)` is what model.dtype = "auto" resolves to, and why."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from helios.device import DeviceInfo

MATRIX_TILE = 16  # the M = N = K tile every cooperative-matrix GPU offers for half inputs -> f32
HALF_ELEMENTS = {"bf16": "bf16", "fp16": "f16"}  # model dtype -> the matrices' element type, as DeviceInfo names it
# Element types whose matrices helios can run on the matrix units: bf16 ones need VK_KHR_shader_bfloat16
# (SPV_KHR_bfloat16), which helios.device does not enable at device creation yet.
ENABLED_ELEMENTS = ("f16",)


def listed_matrix_dtypes(info: DeviceInfo) -> tuple[str, ...]:
    """The half dtypes whose 16x16x16 x -> f32 subgroup matrices the device's own matrix units list (none where
    DeviceInfo.cooperative_matrix is the emulation)."""
    if info.cooperative_matrix_emulated:
        return ()
    shapes = {tuple(s[:6]) for s in info.cooperative_matrix or ()}
    t = MATRIX_TILE
    return tuple(d for d, e in HALF_ELEMENTS.items() if (t, t, t, e, e, "f32") in shapes)


def matrix_unit_dtypes(info: DeviceInfo) -> tuple[str, ...]:
    """The half dtypes a matmul can run on this device's matrix units: listed (listed_matrix_dtypes), their
    element type enabled by helios, and the shader features to hold it (16-bit storage, float16 for f16)."""
    if not info.storage_16bit:
        return ()
    return tuple(d for d in listed_matrix_dtypes(info)
                 if HALF_ELEMENTS[d] in ENABLED_ELEMENTS and (d != "fp16" or info.float16))


def auto_dtype(info: DeviceInfo) -> tuple[str, str]:
    """What model.dtype = "auto" is on a device, and why: fp32 on CPU drivers (lavapipe computes in f32 either
    way), bf16 where the device has bf16 matrix units, fp16 (with loss scaling on the device) where it has only
    fp16 ones, and bf16 storage on a GPU without matrix units (half the memory traffic); fp32 on a GPU without
    16-bit storage. Emulated cooperative matrices (the GPU profile) are not matrix units."""
    if info.is_cpu:
        return "fp32", "a CPU driver computes in f32 either way"
    if not (info.storage_16bit and info.int16):
        return "fp32", "the device cannot keep 16-bit values in buffers (storageBuffer16BitAccess, shaderInt16)"
    usable = matrix_unit_dtypes(info)
    if "bf16" in usable:
        return "bf16", "the device has bf16 matrix units"
    if "fp16" in usable:
        if "bf16" in listed_matrix_dtypes(info):
            return "fp16", ("the device lists bf16 matrix units, which helios does not enable yet "
                            "(VK_KHR_shader_bfloat16), and has fp16 ones (loss scaling on the device)")
        return "fp16", "the device has fp16 matrix units but no bf16 ones (loss scaling on the device)"
    return "bf16", "a GPU without matrix units: bf16 storage halves the memory traffic"
