"""The mixed-precision operand rule, checked at an op's entry: io tensors share one float dtype, while
statistics, losses and parameter gradients are float32 (see helios.kernels.dtypes).

Same signatures as helios.kernels.rows.io_dtype/check_f32 on the rows branch, so the two can merge into
helios.kernels.dtypes as one copy.
"""

from __future__ import annotations

import numpy as np

from helios.kernels.dtypes import FLOAT_DTYPES, is_float


def io_dtype(op: str, **tensors) -> str:
    """The one float dtype ("f32", "bf16" or "fp16") of an op's io tensors (None ones skipped); a mix is a
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
