"""What the cooperative-matrix kernels (the matmul tilings, flash attention) need of a device: 16x16x16 half
matrices with f32 accumulators, subgroups of 4 to 64, 16-bit storage, and shared memory for their tiles; emulated
matrices also need subgroup shuffles. One check for both families, so their rules agree on what a device runs."""

from __future__ import annotations

TILE = 16  # the M = N = K tile every cooperative-matrix GPU offers for half inputs -> fp32
SUBGROUP_SIZES = (4, 64)  # the subgroup sizes the kernels are written for (the emulation needs >= 4 lanes)
ELEMENT = {"fp16": "f16", "bf16": "bf16"}  # io dtype -> the matrices' element type, as DeviceInfo names it


def offered(info, dtype: str) -> bool:
    """Whether the device lists 16x16x16 dtype x dtype -> f32 subgroup matrices (real or emulated)."""
    if dtype not in ELEMENT:
        return False
    elem = ELEMENT[dtype]
    return (TILE, TILE, TILE, elem, elem, "f32") in {tuple(s[:6]) for s in info.cooperative_matrix or ()}


def runs(info, dtype: str, shared_bytes: int, emulated: bool) -> bool:
    """Whether this device can run a cooperative-matrix kernel on dtype operands that needs `shared_bytes` of shared
    memory, lowered natively (the matrix units' instructions) or emulated (plain SPIR-V)."""
    if dtype not in ELEMENT:  # f32 operands never reach the matrix units
        return False
    lo, hi = SUBGROUP_SIZES
    if not (lo <= info.min_subgroup_size and info.max_subgroup_size <= hi and info.storage_16bit):
        return False
    if (dtype == "fp16" and not info.float16) or (dtype == "bf16" and not info.int16):  # f16 / u16 shared tiles
        return False
    if info.max_shared_memory < shared_bytes:
        return False
    if emulated:  # MulAdd reads the operands' elements across lanes by subgroup shuffle
        return "shuffle" in info.subgroup_ops
    # Native bf16 matrices need VK_KHR_shader_bfloat16 (SPV_KHR_bfloat16) enabled at device creation, which
    # helios.device does not do yet, and no GPU here has run them: refused until both are done.
    return offered(info, dtype) and not info.cooperative_matrix_emulated and dtype == "fp16"
