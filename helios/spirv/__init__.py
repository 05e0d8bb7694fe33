"""helios.spirv: SPIR-V emitted directly from Python through a kernel DSL (no shader compiler).

Build a kernel with `Kernel(name, build, variants=...)`, where `build(b: KernelBuilder, v: Variant)`
describes the shader; `kernel.module(variant)` gives the `ShaderModule` the runtime runs.
See docs/SPIRV_DSL.md.
"""

from helios.spirv import registry
from helios.spirv.builder import KernelBuilder
from helios.spirv.kernel import Kernel, Variant, build_module, ceil_div, one_workgroup
from helios.spirv.memory import Buffer, BufferView, LocalArray, SharedArray, Var
from helios.spirv.shader import BindingInfo, PushField, ShaderModule, SpecConstant
from helios.spirv.tools import SpirvToolsMissing, SpirvValidationError, disassemble, validate
from helios.spirv.types import (
    DType,
    ScalarType,
    SpirvError,
    VectorType,
    bf16,
    boolean,
    f16,
    f32,
    fp16,
    i32,
    u16,
    u32,
    u64,
    vec,
)
from helios.spirv.values import Value

__all__ = [
    "KernelBuilder", "Kernel", "Variant", "ShaderModule", "BindingInfo", "PushField", "SpecConstant",
    "Value", "Var", "Buffer", "BufferView", "LocalArray", "SharedArray",
    "DType", "ScalarType", "VectorType", "f32", "f16", "bf16", "fp16", "i32", "u32", "u16", "u64", "boolean",
    "vec",
    "validate", "disassemble", "build_module", "ceil_div", "one_workgroup", "registry",
    "SpirvError", "SpirvValidationError", "SpirvToolsMissing",
]
