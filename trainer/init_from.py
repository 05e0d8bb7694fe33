"""`[train] init_from`: start a new run from another run's weights (fine-tuning, as nanoGPT does), with a fresh
optimizer state, a fresh step count, and the source's tokenizer for the new data.

The source may be a run directory (its latest checkpoint), one checkpoint directory (`ckpt-N`), or a Hugging
Face GPT-2 / LLaMA model directory (`config.json` + `model.safetensors`, e.g. one `trainer export` wrote). The
source's model config (a checkpoint's [model], or config.json) is checked against the new run's [model] on
every field that changes the math, and its parameters name by name and shape by shape: any difference is
refused in one line naming each. `[train] init_strict = false` loads the parameters that match and reports
what it dropped and what it left freshly initialised. An existing checkpoint of the new run always wins:
init_from only shapes step 0.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainer.config import ModelConfig, TrainConfig
from trainer.errors import CheckpointError

PARAM = "param."
_LAYER = re.compile(r"^h\.(\d+)\.")
# The one GELU helios computes; HF's names for the same function.
GELU_TANH_NAMES = {"gelu_new", "gelu_pytorch_tanh"}
_SHOWN = 8  # parameter names listed before "and N more"


def math_signature(m: ModelConfig) -> dict[str, Any]:
    """Every property of a helios model that changes its math (all but dropout, dtype and, for RoPE models,
    block_size: the positions a model has seen do not change what it computes)."""
    gpt2 = m.arch == "gpt2"
    sig = {"arch": m.arch, "positions": "learned" if gpt2 else "rope", "norm": "layernorm" if gpt2 else "rmsnorm",
           "activation": "gelu_tanh" if gpt2 else "swiglu_silu", "n_layer": m.n_layer, "n_head": m.n_head,
           "n_kv_head": m.kv_heads, "n_embd": m.n_embd, "head_dim": m.head_dim, "ffn_hidden": m.ffn_hidden,
           "vocab_size": m.vocab_size, "bias": m.bias, "tie_embeddings": m.tie_embeddings,
           "softcap": float(m.softcap), "norm_eps": float(m.norm_eps), "attention_scale": "1/sqrt(head_dim)"}
    if gpt2:
        sig["block_size"] = m.block_size  # the learned position table's rows
    else:
        sig["rope_base"] = float(m.rope_base)
    return sig


@dataclass
class InitSource:
    """Weights (`param.*` names), the source's math signature (None: a checkpoint too old to record its
    config) and, when the source has one, its tokenizer (JSON text)."""

    path: Path
    params: dict[str, np.ndarray]
    tokenizer_json: str | None
    signature: dict[str, Any] | None = None
    unused: list[str] = field(default_factory=list)  # HF weights that map onto no helios parameter


@dataclass
class InitPlan:
    """What init_from loads: the matching parameters, and what strictness allowed it to leave out."""

    source: InitSource
    loaded: dict[str, np.ndarray]
    config_diffs: list[str]
    dropped: list[str]  # the source has them and this model lacks them (or has them in another shape)
    fresh: list[str]  # this model has them and the source lacks them in this shape: freshly initialised

    def report(self) -> list[str]:
        """Lines for the user (empty when the source matched exactly)."""
        where = f"init_from {self.source.path}"
        out = [f"{where}: {d} (loaded anyway: init_strict = false)" for d in self.config_diffs]
        if self.dropped:
            theirs = {k[len(PARAM):] for k in self.source.params}
            out.append(f"{where}: dropped {len(self.dropped)} source parameter(s) this model lacks or shapes "
                       f"otherwise: {_names(self.dropped, theirs)}")
        if self.fresh:
            mine = set(self.loaded) | set(self.fresh)
            out.append(f"{where}: left {len(self.fresh)} parameter(s) freshly initialised (the source lacks them in "
                       f"this shape): {_names(self.fresh, mine)}")
        return out


def _names(names: list[str], universe: set[str]) -> str:
    """A compact list: `h.N.*` where every `universe` name of layer N is listed; at most _SHOWN entries."""
    listed = set(names)
    layers = {m.group(0) for n in listed if (m := _LAYER.match(n))}
    whole = {p for p in layers if {u for u in universe if u.startswith(p)} <= listed}
    items: list[str] = []
    for name in sorted(listed, key=_layer_order):
        m = _LAYER.match(name)
        item = f"{m.group(0)}*" if m and m.group(0) in whole else name
        if item not in items:
            items.append(item)
    more = f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
    return ", ".join(items[:_SHOWN]) + more


def _layer_order(name: str) -> tuple[int, str]:
    m = _LAYER.match(name)
    return (int(m.group(1)) if m else -1, name)


def load_source(path: Path, train: TrainConfig, model: ModelConfig | None = None) -> InitSource:
    """Read the weights, model config and tokenizer init_from names (see the module docstring for what it may be);
    `train.init_tokenizer`, when set, is the tokenizer; `model` (the new run's) says whether zero biases are kept."""
    if not path.exists():
        raise CheckpointError(f"[train] init_from = {str(path)!r} does not exist: name a run directory, a checkpoint "
                              "directory (ckpt-N) or a Hugging Face model directory")
    if (path / "config.json").exists() and (path / "model.safetensors").exists():
        from trainer.init_from_hf import load_hf_source

        source = load_hf_source(path, model.bias if model is not None else None)
    else:
        source = _load_helios_source(path)
    if train.init_tokenizer is not None:
        source.tokenizer_json = _read_tokenizer(Path(train.init_tokenizer).expanduser())
    elif source.tokenizer_json is None:
        raise CheckpointError(
            f"[train] init_from {path} has no tokenizer.json, and its embeddings only mean something with the "
            "tokenizer they were trained with: give it with --train.init_tokenizer=PATH/tokenizer.json (a "
            "transformers tokenizer writes one with AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR))")
    return source


def _load_helios_source(path: Path) -> InitSource:
    """A run directory (its latest checkpoint, or its newest that verifies) or one ckpt-N directory."""
    from trainer import run_artifacts
    from trainer.checkpoint import list_checkpoints, load_checkpoint, load_resumable

    is_run = (path / "latest").exists() or bool(list_checkpoints(path))
    ckpt = load_resumable(path, "using")[0] if is_run else load_checkpoint(path)
    if ckpt is None:
        raise CheckpointError(f"[train] init_from = {str(path)!r} holds no checkpoint yet")
    tok = path / run_artifacts.TOKENIZER
    tokenizer = tok.read_text(encoding="utf-8") if tok.exists() else ckpt.state.get("tokenizer_json")
    params = {k: v for k, v in ckpt.tensors.items() if k.startswith(PARAM)}
    model = (ckpt.state.get("config") or {}).get("model")
    return InitSource(path, params, tokenizer, _signature_of(model, ckpt.path) if model else None)


def _signature_of(model: dict[str, Any], where: Path) -> dict[str, Any]:
    from trainer.config import config_from_dict
    from trainer.errors import ConfigError

    try:
        cfg = config_from_dict({"model": model}, f"{where}/state.json")
    except ConfigError as exc:
        raise CheckpointError(f"[train] init_from: {exc}") from None
    return math_signature(cfg.model)


def _read_tokenizer(path: Path) -> str:
    from trainer.errors import TrainerError
    from trainer.tokens import load_tokenizer

    if not path.is_file():
        raise CheckpointError(f"[train] init_tokenizer = {str(path)!r} is not a file: name a tokenizer.json")
    try:
        load_tokenizer(path)
        return path.read_text(encoding="utf-8")
    except (TrainerError, OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"[train] init_tokenizer = {str(path)!r} is not a usable tokenizer.json: "
                              f"{exc}") from None


def match_source(source: InitSource, model: ModelConfig, strict: bool) -> InitPlan:
    """Compare the source with the new [model]; strict: any difference is a CheckpointError naming each."""
    from trainer.backend import param_shapes

    want = math_signature(model)
    have = source.signature
    # Keys only one arch has (block_size, rope_base) differ with arch, which is named already.
    diffs = [] if have is None else [f"{k} {_fmt(have[k])} there, {_fmt(v)} here" for k, v in want.items()
                                     if k in have and have[k] != v]
    shapes = param_shapes(model)
    theirs = {k[len(PARAM):]: v for k, v in source.params.items()}
    loaded = {n: theirs[n] for n, s in shapes.items() if n in theirs and tuple(theirs[n].shape) == tuple(s)}
    reshaped = sorted(n for n in shapes if n in theirs and n not in loaded)
    extra = sorted(set(theirs) - set(shapes)) + source.unused
    lacking = sorted(set(shapes) - set(theirs))
    if strict and (diffs or reshaped or extra or lacking):
        parts = diffs + [f"{n} {list(theirs[n].shape)} there, {list(shapes[n])} here" for n in reshaped[:_SHOWN]]
        if len(reshaped) > _SHOWN:
            parts.append(f"and {len(reshaped) - _SHOWN} more parameters shaped otherwise")
        if extra:
            parts.append(f"source parameters this model lacks: {_names(extra, set(theirs))}")
        if lacking:
            parts.append(f"parameters the source lacks: {_names(lacking, set(shapes))}")
        raise CheckpointError(f"[train] init_from {source.path} does not match this run's [model]: "
                              f"{'; '.join(parts)}; use the source's [model] settings, or "
                              "--train.init_strict=false to load only the parameters that match")
    return InitPlan(source, loaded, diffs, extra + reshaped, lacking + reshaped)


def _fmt(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (bool, str)) or value is None else repr(value)


def initial_state(plan: InitPlan, fresh: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A state_dict for step 0: the source's matching parameters (the rest from `fresh`, a new backend's
    state_dict), zero AdamW moments, step 0."""
    state: dict[str, np.ndarray] = {"adam_step": np.array(0, np.int64), "rng_forwards": np.array(0, np.int64)}
    for key, value in fresh.items():
        if not key.startswith(PARAM):
            continue
        name = key[len(PARAM):]
        shape = np.shape(value)
        state[key] = np.asarray(plan.loaded[name], np.float32) if name in plan.loaded else value
        state[f"adam_m.{name}"] = np.zeros(shape, np.float32)
        state[f"adam_v.{name}"] = np.zeros(shape, np.float32)
    return state
