"""`trainer export`: a run's latest checkpoint as a Hugging Face model directory (`config.json` +
`model.safetensors`, and the run's tokenizer as `tokenizer.json` with a `tokenizer_config.json`), loadable with
`transformers.AutoModelForCausalLM.from_pretrained(dir)`; and the way back, HF weights as a state to start
from (`init_from`).

gpt2 runs become `GPT2LMHeadModel` (its Conv1D weights are [in, out]: ours are transposed; a run without
biases exports zero biases). llama runs become `LlamaForCausalLM`: RoPE in the half-split (rotate_half)
layout that both use, grouped-query attention, SwiGLU as gate/up/down. Features HF's classes lack (attention
softcap, grouped KV heads in gpt2) are refused with a clear message.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from trainer.config import ModelConfig
from trainer.errors import TrainerError

PARAM = "param."


def _hf_config(m: ModelConfig) -> dict:
    if m.softcap:
        raise TrainerError("this model uses attention softcap, which Hugging Face's GPT-2 and LLaMA classes lack")
    if m.arch == "gpt2":
        if m.n_kv_head != m.n_head:
            raise TrainerError("Hugging Face's GPT-2 has no grouped-query attention: export needs n_kv_head = n_head")
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": m.vocab_size,
                "n_positions": m.block_size, "n_ctx": m.block_size, "n_embd": m.n_embd, "n_layer": m.n_layer,
                "n_head": m.n_head, "n_inner": m.ffn_hidden, "activation_function": "gelu_new",
                "layer_norm_epsilon": m.norm_eps, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
                "tie_word_embeddings": m.tie_embeddings, "bos_token_id": 0, "eos_token_id": 0}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": m.vocab_size,
            "hidden_size": m.n_embd, "intermediate_size": m.ffn_hidden, "num_hidden_layers": m.n_layer,
            "num_attention_heads": m.n_head, "num_key_value_heads": m.n_kv_head, "head_dim": m.head_dim,
            "max_position_embeddings": m.block_size, "rms_norm_eps": m.norm_eps, "rope_theta": m.rope_base,
            "attention_bias": m.bias, "mlp_bias": m.bias, "hidden_act": "silu",
            "tie_word_embeddings": m.tie_embeddings, "bos_token_id": 0, "eos_token_id": 0}


def _gpt2_weights(m: ModelConfig, p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    C = m.n_embd
    zeros = lambda n: np.zeros(n, np.float32)  # noqa: E731  (HF GPT-2 always has biases)
    out = {"transformer.wte.weight": p["wte.weight"], "transformer.wpe.weight": p["wpe.weight"],
           "transformer.ln_f.weight": p["ln_f.weight"], "transformer.ln_f.bias": p.get("ln_f.bias", zeros(C))}
    for i in range(m.n_layer):
        h, o = f"h.{i}.", f"transformer.h.{i}."
        for ln in ("ln_1", "ln_2"):
            out[o + ln + ".weight"] = p[h + ln + ".weight"]
            out[o + ln + ".bias"] = p.get(h + ln + ".bias", zeros(C))
        for ours, theirs in (("attn.c_attn", "attn.c_attn"), ("attn.c_proj", "attn.c_proj"),
                             ("mlp.c_fc", "mlp.c_fc"), ("mlp.c_proj", "mlp.c_proj")):
            w = p[h + ours + ".weight"]
            out[o + theirs + ".weight"] = np.ascontiguousarray(w.T)  # Conv1D stores [in, out]
            out[o + theirs + ".bias"] = p.get(h + ours + ".bias", zeros(w.shape[0]))
    if not m.tie_embeddings:
        out["lm_head.weight"] = p["lm_head.weight"]
    return out


def _llama_weights(m: ModelConfig, p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    q, kv = m.n_head * m.head_dim, m.n_kv_head * m.head_dim
    out = {"model.embed_tokens.weight": p["wte.weight"], "model.norm.weight": p["ln_f.weight"]}
    for i in range(m.n_layer):
        h, o = f"h.{i}.", f"model.layers.{i}."
        out[o + "input_layernorm.weight"] = p[h + "ln_1.weight"]
        out[o + "post_attention_layernorm.weight"] = p[h + "ln_2.weight"]
        for part, name in zip(np.split(p[h + "attn.c_attn.weight"], [q, q + kv]), ("q", "k", "v"), strict=True):
            out[o + f"self_attn.{name}_proj.weight"] = part
        if m.bias:
            for part, name in zip(np.split(p[h + "attn.c_attn.bias"], [q, q + kv]), ("q", "k", "v"), strict=True):
                out[o + f"self_attn.{name}_proj.bias"] = part
        pairs = [("attn.c_proj", "self_attn.o_proj"), ("mlp.w_gate", "mlp.gate_proj"), ("mlp.w_up", "mlp.up_proj"),
                 ("mlp.w_down", "mlp.down_proj")]
        for ours, theirs in pairs:
            out[o + theirs + ".weight"] = p[h + ours + ".weight"]
            if m.bias:
                out[o + theirs + ".bias"] = p[h + ours + ".bias"]
    if not m.tie_embeddings:
        out["lm_head.weight"] = p["lm_head.weight"]
    return out


def hf_state(m: ModelConfig, tensors: dict[str, np.ndarray]) -> tuple[dict, dict[str, np.ndarray]]:
    """(config.json dict, HF-named float32 weights) of a checkpoint's `param.*` tensors."""
    config = _hf_config(m)
    params = {k[len(PARAM):]: np.asarray(v, np.float32) for k, v in tensors.items() if k.startswith(PARAM)}
    weights = _gpt2_weights(m, params) if m.arch == "gpt2" else _llama_weights(m, params)
    return config, {k: np.ascontiguousarray(v) for k, v in weights.items()}


def tokenizer_config(m: ModelConfig) -> dict:
    """tokenizer_config.json for `transformers.AutoTokenizer`: the fast tokenizer over tokenizer.json, with the
    end-of-text token (id 0, as config.json's bos/eos_token_id say) as its bos, eos and unk token. Without it
    AutoTokenizer has no eos_token, and generate() cannot stop."""
    from trainer.tokens import EOT

    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOT, "eos_token": EOT, "unk_token": EOT,
            "model_max_length": m.block_size, "clean_up_tokenization_spaces": False}


def check_out_dir(run_dir: Path, out_dir: Path, force: bool) -> None:
    """Refuse an export into the run directory or one of its checkpoints (always), or into a folder that is not
    empty unless `force`: an export overwrites config.json and model.safetensors where it writes."""
    out, run = out_dir.expanduser().resolve(), run_dir.expanduser().resolve()
    if out == run or (out.parent == run and (out / "state.json").exists()):
        what = "the run directory itself" if out == run else f"the run's checkpoint {out.name}"
        raise TrainerError(f"--out {out_dir} is {what}: the export would overwrite its files; choose another --out")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise TrainerError(f"--out {out_dir} exists and is not empty: choose a new folder, or pass --force to write "
                           "the export's files into it (files of the same name are replaced)")


def export_run(run_dir: Path, out_dir: Path, choice: str | None = None) -> Path:
    """Write the run's latest checkpoint (or the one `choice` names: `--ckpt`) to out_dir as a Hugging Face
    model directory."""
    from safetensors.numpy import save

    from trainer import run_artifacts
    from trainer.checkpoint import load_chosen
    from trainer.session import read_resolved

    cfg, _ = read_resolved(run_dir)
    ckpt, _ = load_chosen(run_dir, choice, "using")
    if ckpt is None:
        raise TrainerError(f"run {run_dir} has no checkpoint yet")
    config, weights = hf_state(cfg.model, ckpt.tensors)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        # Serialised here and written with open(), so the file gets the umask's mode (safetensors' save_file
        # leaves 0600, which other users and containers cannot read).
        (out_dir / "model.safetensors").write_bytes(save(weights, metadata={"format": "pt"}))
        tokenizer = run_dir / run_artifacts.TOKENIZER
        text = tokenizer.read_text(encoding="utf-8") if tokenizer.exists() else ckpt.state.get("tokenizer_json")
        if text:
            (out_dir / "tokenizer.json").write_text(text, encoding="utf-8")
            (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(cfg.model), indent=2) + "\n")
    except OSError as exc:
        raise TrainerError(f"cannot write the export to {out_dir}: {exc.strerror or exc}") from None
    return out_dir


def params_from_hf(m: ModelConfig, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inverse of `hf_state`: our `param.*` tensors from Hugging Face GPT-2 / LLaMA weights."""
    w = {k: np.asarray(v, np.float32) for k, v in weights.items()}

    def take(name: str) -> np.ndarray:
        if name not in w:
            raise TrainerError(f"the Hugging Face weights have no '{name}': not a {m.arch} model of this shape")
        return w[name]

    out: dict[str, np.ndarray] = {}
    if m.arch == "gpt2":
        out["wte.weight"], out["wpe.weight"] = take("transformer.wte.weight"), take("transformer.wpe.weight")
        out["ln_f.weight"] = take("transformer.ln_f.weight")
        if m.bias:
            out["ln_f.bias"] = take("transformer.ln_f.bias")
        for i in range(m.n_layer):
            h, o = f"h.{i}.", f"transformer.h.{i}."
            for ln in ("ln_1", "ln_2"):
                out[h + ln + ".weight"] = take(o + ln + ".weight")
                if m.bias:
                    out[h + ln + ".bias"] = take(o + ln + ".bias")
            for name in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
                out[h + name + ".weight"] = np.ascontiguousarray(take(o + name + ".weight").T)
                if m.bias:
                    out[h + name + ".bias"] = take(o + name + ".bias")
    else:
        out["wte.weight"], out["ln_f.weight"] = take("model.embed_tokens.weight"), take("model.norm.weight")
        for i in range(m.n_layer):
            h, o = f"h.{i}.", f"model.layers.{i}."
            out[h + "ln_1.weight"] = take(o + "input_layernorm.weight")
            out[h + "ln_2.weight"] = take(o + "post_attention_layernorm.weight")
            qkv = [take(o + f"self_attn.{x}_proj.weight") for x in "qkv"]
            out[h + "attn.c_attn.weight"] = np.concatenate(qkv)
            if m.bias:
                out[h + "attn.c_attn.bias"] = np.concatenate([take(o + f"self_attn.{x}_proj.bias") for x in "qkv"])
            for ours, theirs in (("attn.c_proj", "self_attn.o_proj"), ("mlp.w_gate", "mlp.gate_proj"),
                                 ("mlp.w_up", "mlp.up_proj"), ("mlp.w_down", "mlp.down_proj")):
                out[h + ours + ".weight"] = take(o + theirs + ".weight")
                if m.bias:
                    out[h + ours + ".bias"] = take(o + theirs + ".bias")
    if not m.tie_embeddings:
        out["lm_head.weight"] = take("lm_head.weight")
    return out
