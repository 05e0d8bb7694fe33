"""The float dtype axis that every kernel family shares: fp32, bf16 and fp16 tensors.

A kernel variant's `dtype` param ("f32", "bf16" or "fp16") says how its float tensors are stored; math is
always f32 in registers. bf16 and fp16 buffers hold 16-bit patterns that load as f32 and store rounded to
nearest even (helios.spirv's bf16/fp16 storage types), so every dtype runs on any device with 16-bit
storage, lavapipe included. Variant names carry the dtype as a prefix: "vec4" (f32), "bf16_vec4",
"fp16_vec4". Accumulators, statistics and losses stay f32 whatever the dtype.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from helios.runtime.tensor import BFLOAT16, Tensor
from helios.spirv import ScalarType, bf16, f32, fp16

DTYPES = ("f32", "bf16", "fp16")
HALF_DTYPES = ("bf16", "fp16")
NUMPY = {"f32": np.dtype(np.float32), "bf16": BFLOAT16, "fp16": np.dtype(np.float16)}
FLOAT_DTYPES = {v: k for k, v in NUMPY.items()}  # numpy dtype -> kernel dtype name
STORAGE: dict[str, ScalarType] = {"f32": f32, "bf16": bf16, "fp16": fp16}
# One rounding of each dtype, relative (half a unit in the last place): the tests' tolerance unit.
ROUNDING = {"f32": 2.0 ** -24, "bf16": 2.0 ** -8, "fp16": 2.0 ** -11}


def storage(dtype: str) -> ScalarType:
    """The DSL storage type of a kernel dtype name (what `b.buffer(binding, storage(v.dtype), ...)` takes)."""
    return STORAGE[dtype]


def variant_dtype(params: Mapping) -> str:
    """A variant's dtype ("f32" when its params do not say)."""
    return params.get("dtype", "f32")


def with_dtypes(variants: Mapping[str, Mapping], dtypes: Sequence[str] = DTYPES) -> dict[str, dict]:
    """A variant table again for every half dtype: "name" (f32) plus "bf16_name" and "fp16_name"."""
    out = {name: dict(p) for name, p in variants.items()}
    for dtype in dtypes:
        if dtype != "f32":
            out.update({f"{dtype}_{name}": {**p, "dtype": dtype} for name, p in variants.items()})
    return out


def dtype_variant(name: str, dtype: str) -> str:
    """The variant of base variant `name` for dtype."""
    return name if dtype == "f32" else f"{dtype}_{name}"


def is_float(t: Tensor) -> bool:
    return t.dtype in FLOAT_DTYPES


def float_dtype(tensors: Sequence[Tensor]) -> str:
    """"f32", "bf16" or "fp16": the one float dtype of a launch's float operands (integer ones, such as ids,
    masks and counters, do not count); mixing them is an error that says what to do."""
    found = {FLOAT_DTYPES[t.dtype] for t in tensors if is_float(t)}
    if len(found) > 1:
        raise TypeError(f"operands mix {' and '.join(sorted(found))}: convert one side first (helios.ops.cast)")
    return found.pop() if found else "f32"


def check_float(*tensors: Tensor) -> str:
    """Float tensors (float32, bfloat16 or float16), all of one dtype; returns that dtype's name."""
    for t in tensors:
        if not is_float(t):
            raise TypeError(f"expected a float32, bfloat16 or float16 tensor, got {t.dtype} {t.shape}")
    return float_dtype(tensors)


def io_dtype(op: str, **tensors) -> str:
    """The one float dtype ("f32", "bf16" or "fp16") of an op's io tensors (None ones skipped).

    Activations, their gradients and the weights they are read with share the io dtype; a mix is a
    TypeError naming each tensor's dtype."""
    named = {k: t for k, t in tensors.items() if t is not None}
    for k, t in named.items():
        if not is_float(t):
            raise TypeError(f"{op}: {k} is {t.dtype} {t.shape}; expected float32, bfloat16 or float16")
    found = {k: FLOAT_DTYPES[t.dtype] for k, t in named.items()}
    if len(set(found.values())) > 1:
        mix = ", ".join(f"{k} is {d}" for k, d in found.items())
        raise TypeError(f"{op}: {mix}; these share one dtype (the activations' and the weights' working copy): "
                        "convert one side first (helios.ops.cast)")
    return next(iter(found.values()), "f32")


def check_f32(op: str, **tensors) -> None:
    """Statistics, losses and parameter gradients are float32 whatever the io dtype (None ones skipped)."""
    for k, t in tensors.items():
        if t is not None and t.dtype != np.float32:
            raise TypeError(f"{op}: {k} is {t.dtype} {t.shape}; it must be float32 (statistics, losses and "
                            "parameter gradients stay f32 whatever the activations' dtype)")


__all__ = ["DTYPES", "HALF_DTYPES", "NUMPY", "FLOAT_DTYPES", "ROUNDING", "storage", "variant_dtype", "with_dtypes",
           "dtype_variant", "float_dtype", "check_float", "is_float",
           "io_dtype", "check_f32"]
