"""Two selection rules (helios.kernels.contract.selection) for the fused decode kernels.

"decode": whether a model's one-token decode steps take the fused kernels ("fused": block.py per layer, head.py
for ln_f and the LM head) or the unfused ops ("unfused", autograd/nn/decode.py's general path). Its shape is the
model's: (arch, n_embd, n_head, n_kv_head, hidden, block_size, vocab, bias, softcap). "fused" covers GPT-2 blocks
(LayerNorm with bias, biased projections, gelu MLP, multi-head attention without softcap) in f32 where the
kernels' shared memory, workgroup and needs fit the device (the device contract); anything else (a llama block:
RMSNorm, RoPE, SwiGLU, GQA; softcap; bias-free layers; half dtypes; a device too small) runs unfused, and
`refusal` says why in words. Forcing "fused" where it does not apply still runs unfused.

"decode_kernels": which variant of both kernels runs, shape (n_embd,): "addressed" (the cache and weight matrices
read through device addresses) where the driver turns such loads into gathers (lavapipe on Mesa 25:
helios.device.driver.gathers_pay_off) and the device enables addresses, "plain" elsewhere.
"""

from __future__ import annotations

from helios.kernels.contract import selection
from helios.kernels.decode.block import DECODE_BLOCK, VARIANTS
from helios.kernels.decode.block import SHAPES as BLOCK_SHAPES
from helios.kernels.decode.block import spec_values as block_spec
from helios.kernels.decode.head import DECODE_HEAD
from helios.kernels.decode.head import SHAPES as HEAD_SHAPES
from helios.runtime import contract

CHOICES = ("fused", "unfused")


def shape_of(cfg) -> tuple:
    """The "decode" rule's shape for a GPTConfig."""
    return (cfg.arch, cfg.n_embd, cfg.n_head, cfg.kv_heads, cfg.ffn_hidden, cfg.block_size, cfg.vocab_size,
            int(cfg.bias), float(cfg.softcap))


def refusal(info, shape: tuple, dtype: str) -> str | None:
    """Why the fused decode kernels do not run this model (the "decode" rule's shape) on info's device, or None."""
    arch, C, H, Hkv, hidden, block_size, _, bias, softcap = shape
    if arch != "gpt2":
        return f"arch {arch!r}: the fused kernels cover gpt2 blocks only (not RMSNorm, RoPE, SwiGLU)"
    if dtype != "f32":
        return f"dtype {dtype}: the fused kernels are f32 only"
    if Hkv != H:
        return f"grouped-query attention ({H} heads, {Hkv} KV heads)"
    if not bias:
        return "bias-free layers"
    if softcap:
        return "softcapped attention"
    if C % 4 or C % H or (C // H) % 4 or hidden % 4:
        return f"n_embd {C}, n_head {H}, hidden {hidden}: n_embd, head_dim and hidden must be multiples of 4"
    variant = _choose_variant(info, (C,), "f32", None)
    spec = block_spec(C, H, hidden, block_size)
    for kernel, kernel_spec in ((DECODE_BLOCK, spec), (DECODE_HEAD, {"C4": C // 4})):
        if not selection.fits(info, kernel, variant, kernel_spec):
            unmet = contract.unmet_needs(kernel.module(variant), info, kernel_spec)
            return f"kernel {kernel.name}:{variant} does not fit the device: it needs " + "; ".join(unmet)
    return None


@selection.rule("decode", choices=CHOICES, forced=())
def _choose(info, shape: tuple, dtype: str, forced: str | None) -> str:
    """"fused" where `refusal` finds nothing in the way (forced "unfused" aside), else "unfused"."""
    if forced == "unfused" or refusal(info, shape, dtype) is not None:
        return "unfused"
    return "fused"


def plan(cfg, dtype: str) -> str:
    """"fused" or "unfused" for a model's one-token decode steps on this device."""
    return selection.choose("decode", shape_of(cfg), dtype)


def _subgroup_shapes(shape: tuple) -> bool:
    """At CI's extra subgroup sizes the decode kernels run all but their largest test shapes (the default model's,
    the slowest to compile): what differs between sizes (the workgroup sums, each subgroup's share of a head's
    softmax) is covered by the odd widths and contexts."""
    return shape not in (BLOCK_SHAPES[-1], HEAD_SHAPES[-1])


# The op-spec tests run both variants (each where the device contract lets it: "addressed" needs device addresses).
# CI runs "plain" again at subgroup sizes 4 and 16: the workgroup sums and the per-head softmax use subgroup
# operations, in code both variants share (they differ only in how they load); "plain" is what GPUs run, and
# "addressed" runs at lavapipe's own 8 lanes.
@selection.rule("decode_kernels", choices=tuple(VARIANTS), subgroup=(
    selection.Subgroup("plain", shapes=_subgroup_shapes),))
def _choose_variant(info, shape: tuple, dtype: str, forced: str | None) -> str:
    """"addressed" where device addresses are enabled and pay off (lavapipe, Mesa 25), else "plain"; a forced
    "addressed" on a device without addresses is an error naming it."""
    from helios.device.driver import gathers_pay_off

    if forced == "addressed":
        selection.check_addressed(info, "decode_kernels", forced)
    if forced is not None:
        return forced
    return "addressed" if info.buffer_device_address and gathers_pay_off(info) else "plain"
