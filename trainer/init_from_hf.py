"""init_from a Hugging Face GPT-2 / LLaMA directory: its `config.json` read into the same math signature as a
helios model (trainer.init_from.math_signature), and its weights renamed to helios parameters.

Every config.json field that changes what the model computes is read (with transformers' defaults where it is
absent); one helios cannot represent (a ReLU GPT-2, scaled RoPE, per-layer attention scaling) becomes a value no
helios model has, so the comparison names it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from trainer.config import ModelConfig
from trainer.errors import CheckpointError, TrainerError
from trainer.init_from import GELU_TANH_NAMES, PARAM, InitSource

# Buffers, not parameters, that some HF checkpoints carry.
_BUFFERS = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


def load_hf_source(path: Path, want_bias: bool | None = None) -> InitSource:
    """Weights, math signature and tokenizer of a Hugging Face model directory; `want_bias` is the new run's
    [model] bias (None: unknown), which decides whether a GPT-2's all-zero biases are kept or are no biases."""
    from safetensors.numpy import load_file

    try:
        doc = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"[train] init_from {path}/config.json is unreadable: {exc}") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"[train] init_from {path}/config.json is not a JSON object")
    try:
        weights = load_file(str(path / "model.safetensors"))
    except Exception as exc:  # safetensors raises its own error type for every kind of bad file
        raise CheckpointError(f"[train] init_from {path}/model.safetensors is unreadable: {exc}") from None
    model, signature = _read_config(doc, path)
    weights = {k: v for k, v in weights.items() if not k.endswith(_BUFFERS)}
    if model.arch == "gpt2" and "transformer.wte.weight" not in weights and "wte.weight" in weights:
        weights = {("" if k == "lm_head.weight" else "transformer.") + k: v for k, v in weights.items()}
    if model.tie_embeddings and "lm_head.weight" in weights:  # some exports keep the tied head as a copy
        wte = weights.get("transformer.wte.weight", weights.get("model.embed_tokens.weight"))
        if wte is not None and np.array_equal(weights["lm_head.weight"], wte):
            del weights["lm_head.weight"]
    from trainer.export import hf_state, params_from_hf

    if model.arch == "gpt2" and "transformer.ln_f.bias" not in weights:  # a GPT-2 saved without its biases
        model = dataclasses.replace(model, bias=False)
        signature["bias"] = False
    try:
        params = params_from_hf(model, weights)
        expected = set(hf_state(model, {PARAM + k: v for k, v in params.items()})[1])
    except TrainerError as exc:
        raise CheckpointError(f"[train] init_from {path}: {exc}") from None
    biases = [k for k in params if k.endswith(".bias")]
    if model.arch == "gpt2" and biases and want_bias is False and not any(np.any(params[k]) for k in biases):
        # The file holds biases, so the source has them; a bias-free run may still drop them when every one is
        # zero (what `trainer export` writes for a bias-free model), as that loses nothing. Never decided from the
        # values alone: a freshly initialised HF GPT-2 has zero biases too, and a bias = true run keeps them.
        signature["bias"] = False
        params = {k: v for k, v in params.items() if k not in biases}
    tok = path / "tokenizer.json"
    return InitSource(path, {PARAM + k: v for k, v in params.items()},
                      tok.read_text(encoding="utf-8") if tok.exists() else None, signature,
                      sorted(f"{k} (Hugging Face name)" for k in set(weights) - expected))


def _read_config(doc: dict[str, Any], path: Path) -> tuple[ModelConfig, dict[str, Any]]:
    """(a helios ModelConfig with the source's shapes, for renaming its weights; its math signature)."""
    kind = doc.get("model_type")

    def need(key: str) -> int:
        value = doc.get(key)
        if key not in doc:
            raise CheckpointError(f"[train] init_from {path}/config.json has no '{key}' (a {kind} config needs it)")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise CheckpointError(f"[train] init_from {path}/config.json: '{key}' = {value!r} is not a positive "
                                  "integer")
        return value

    if kind == "gpt2":
        n_embd, n_head, n_layer = need("n_embd"), need("n_head"), need("n_layer")
        model = ModelConfig(arch="gpt2", n_layer=n_layer, n_head=n_head, n_kv_head=n_head, n_embd=n_embd,
                            block_size=need("n_positions"), vocab_size=need("vocab_size"), bias=True,
                            tie_embeddings=doc.get("tie_word_embeddings", True),
                            norm_eps=float(doc.get("layer_norm_epsilon", 1e-5)))
        act = doc.get("activation_function", "gelu_new")
        scale = "1/sqrt(head_dim)" if doc.get("scale_attn_weights", True) else "none"
        if doc.get("scale_attn_by_inverse_layer_idx", False):
            scale += " / (layer + 1)"
        extra = {"activation": "gelu_tanh" if act in GELU_TANH_NAMES else act, "attention_scale": scale,
                 "ffn_hidden": doc.get("n_inner") or 4 * n_embd}
    elif kind == "llama":
        n_embd, n_head = need("hidden_size"), need("num_attention_heads")
        head_dim = doc.get("head_dim") or n_embd // n_head
        attn_bias, mlp_bias = bool(doc.get("attention_bias", False)), bool(doc.get("mlp_bias", False))
        model = ModelConfig(arch="llama", n_layer=need("num_hidden_layers"), n_head=n_head,
                            n_kv_head=doc.get("num_key_value_heads") or n_head, n_embd=n_embd,
                            block_size=doc.get("max_position_embeddings", 2048), vocab_size=need("vocab_size"),
                            bias=attn_bias and mlp_bias, tie_embeddings=doc.get("tie_word_embeddings", False),
                            rope_base=float(doc.get("rope_theta", 10000.0)),
                            norm_eps=float(doc.get("rms_norm_eps", 1e-6)))
        scaling = doc.get("rope_scaling")
        extra = {"activation": f"swiglu_{doc.get('hidden_act', 'silu')}", "head_dim": head_dim,
                 "ffn_hidden": need("intermediate_size"),
                 "positions": f"rope scaled ({scaling.get('rope_type', scaling.get('type'))})"
                 if isinstance(scaling, dict) else "rope",
                 "bias": attn_bias if attn_bias == mlp_bias else f"attention {attn_bias}, mlp {mlp_bias}"}
    else:
        raise CheckpointError(f"[train] init_from {path} is a Hugging Face {kind or 'unknown'} model: init_from "
                              "reads GPT-2 and LLaMA models (model_type gpt2 or llama)")
    from trainer.init_from import math_signature

    return model, dict(math_signature(model), **extra)
