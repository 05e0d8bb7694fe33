"""The "decode" selection rule: whether a model's one-token decode steps take the fused kernels ("fused": block.py
per layer, head.py for ln_f and the LM head) or the unfused ops ("unfused", autograd/nn/decode.py's general path).

The shape is the model's: (arch, n_embd, n_head, n_kv_head, hidden, block_size, vocab, bias, softcap). "fused"
covers GPT-2 blocks (LayerNorm with bias, biased projections, gelu MLP, multi-head attention without softcap) in
f32, where the block kernel's shared memory and workgroup fit the device (the device contract); anything else (a
llama block: RMSNorm, RoPE, SwiGLU, GQA; softcap; no biases; half dtypes; a device too small) runs unfused, and
`refusal` says why in words. Forcing "fused" where it does not apply still runs unfused.
"""

from __future__ import annotations

from helios.kernels.contract import selection
from helios.kernels.decode.block import DECODE_BLOCK
from helios.kernels.decode.block import spec_values as block_spec
from helios.kernels.decode.head import DECODE_HEAD

CHOICES = ("fused", "unfused")


def shape_of(cfg) -> tuple:
    """The rule's shape for a GPTConfig."""
    return (cfg.arch, cfg.n_embd, cfg.n_head, cfg.kv_heads, cfg.ffn_hidden, cfg.block_size, cfg.vocab_size,
            int(cfg.bias), float(cfg.softcap))


def refusal(info, shape: tuple, dtype: str) -> str | None:
    """Why the fused decode kernels do not run this model on info's device, or None where they do."""
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
        return f"n_embd {C}, head_dim {C // H if C % H == 0 else C / H}, hidden {hidden}: not multiples of 4"
    spec = block_spec(C, H, hidden, block_size)
    if not selection.fits(info, DECODE_BLOCK, "f32", spec):
        return f"the block kernel's {DECODE_BLOCK.module('f32').shared_bytes_for(spec)} bytes of shared memory or " \
               "its workgroup exceed the device's limits"
    if not selection.fits(info, DECODE_HEAD, "f32", {"C4": C // 4}):
        return "the head kernel does not fit the device"
    return None


# The op-spec tests run the fused kernels ("fused"): "unfused" is no kernel of this family. CI runs them again at
# subgroup sizes 4 and 16: the workgroup sums and the per-head softmax use subgroup operations.
@selection.rule("decode", choices=CHOICES, forced=("fused",), subgroup=(selection.Subgroup("fused"),))
def _choose(info, shape: tuple, dtype: str, forced: str | None) -> str:
    """"fused" where `refusal` finds nothing in the way (forced "unfused" aside), else "unfused"."""
    if forced == "unfused" or refusal(info, shape, dtype) is not None:
        return "unfused"
    return "fused"


def plan(cfg, dtype: str) -> str:
    """"fused" or "unfused" for a model's one-token decode steps on this device."""
    return selection.choose("decode", shape_of(cfg), dtype)
