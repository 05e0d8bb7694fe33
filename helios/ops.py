"""Every op function of docs/OPS.md in one namespace: `from helios import ops; ops.gelu(x)`.

Each name maps to the kernel file that declares it; the kernel module is imported on first use, so
importing helios stays cheap and a kernel family is only built when something calls it.
"""

from __future__ import annotations

import importlib

_FAMILIES = {
    "helios.kernels.elementwise": (
        "add", "sub", "mul", "div", "scale", "neg", "clone", "masked_fill", "add_inplace",
    ),
    "helios.kernels.activations": (
        "clamp", "softcap", "clamp_backward", "softcap_backward",
    ),
    "helios.kernels.fused": ("swiglu", "swiglu_backward", "residual_dropout_add", "residual_dropout_add_backward"),
    "helios.kernels.dropout": ("dropout", "dropout_backward"),
    "helios.kernels.reduce": ("sum", "mean", "max", "sum_rows", "sumsq"),
    "helios.kernels.softmax": ("softmax", "softmax_backward"),
    "helios.kernels.norms": ("layernorm", "layernorm_backward", "rmsnorm", "rmsnorm_backward"),
    "helios.kernels.embedding": ("embedding", "embedding_backward"),
    "helios.kernels.rope": ("rope",),
    "helios.kernels.cross_entropy": ("cross_entropy",),
    "helios.kernels.adamw": ("grad_norm", "adamw_step"),
    "helios.kernels.matmul": ("matmul",),
    "helios.kernels.attention": ("flash_attention", "flash_attention_backward"),
    "helios.kernels.layout": ("concat", "slice_columns", "copy_columns"),
    "helios.kernels.cast": ("cast", "scale_by"),
    "helios.kernels.loss_scale": ("loss_scale_update",),
}
_WHERE = {name: module for module, names in _FAMILIES.items() for name in names}


def _spec_ops() -> dict[str, str]:
    """Op functions declared by op specs (helios.kernels.spec): found by discovery, never listed here."""
    from helios.kernels.spec import op_functions

    return op_functions()


def __getattr__(name: str):
    if name == "__all__":
        return sorted(_WHERE | _spec_ops())
    module = _WHERE.get(name) or _spec_ops().get(name)
    if module is None:
        raise AttributeError(f"helios.ops has no op {name!r}; the ops are listed in docs/OPS.md")
    kernels = importlib.import_module(module)
    value = getattr(kernels, "OP_NAMES", {}).get(name) or getattr(kernels, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(_WHERE | _spec_ops())
