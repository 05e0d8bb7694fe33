"""`[train] init_from`: start a new run from another run's weights (fine-tuning, as nanoGPT does), with a fresh
optimizer state, a fresh step count, and the source's tokenizer for the new data.

The source may be a run directory (its latest checkpoint), one checkpoint directory (`ckpt-N`), or a Hugging
Face model directory (`config.json` + `model.safetensors`, e.g. one `trainer export` wrote). Its parameter
shapes must match the new run's [model] exactly; anything else is refused with the first mismatch named.
An existing checkpoint of the new run always wins: init_from only shapes step 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.config import ModelConfig
from trainer.errors import CheckpointError


@dataclass
class InitSource:
    """Weights (`param.*` names) and, when the source has one, its tokenizer (JSON text)."""

    path: Path
    params: dict[str, np.ndarray]
    tokenizer_json: str | None


def load_source(path: Path, model: ModelConfig) -> InitSource:
    """Read the weights init_from names (see the module docstring for what it may be)."""
    from trainer import run_artifacts
    from trainer.checkpoint import load_checkpoint, load_latest

    if not path.exists():
        raise CheckpointError(f"[train] init_from = {str(path)!r} does not exist: name a run directory, a checkpoint "
                              "directory (ckpt-N) or a Hugging Face model directory")
    if (path / "config.json").exists() and (path / "model.safetensors").exists():
        from safetensors.numpy import load_file

        from trainer.export import params_from_hf

        params = {f"param.{k}": v for k, v in params_from_hf(model, load_file(str(path / "model.safetensors"))).items()}
        tok = path / "tokenizer.json"
        return InitSource(path, params, tok.read_text(encoding="utf-8") if tok.exists() else None)
    ckpt = load_latest(path) if (path / "latest").exists() else load_checkpoint(path)
    if ckpt is None:
        raise CheckpointError(f"[train] init_from = {str(path)!r} holds no checkpoint yet")
    tok = path / run_artifacts.TOKENIZER
    tokenizer = tok.read_text(encoding="utf-8") if tok.exists() else ckpt.state.get("tokenizer_json")
    return InitSource(path, {k: v for k, v in ckpt.tensors.items() if k.startswith("param.")}, tokenizer)


def initial_state(source: InitSource, expected: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """A state_dict for step 0: the source's parameters, zero AdamW moments, step 0."""
    state: dict[str, np.ndarray] = {"adam_step": np.array(0, np.int64), "rng_forwards": np.array(0, np.int64)}
    for name, shape in expected.items():
        key = f"param.{name}"
        if key not in source.params:
            raise CheckpointError(f"[train] init_from {source.path}: it has no parameter {name}; its model differs "
                                  "from this run's [model]")
        value = np.asarray(source.params[key], np.float32)
        if tuple(value.shape) != tuple(shape):
            raise CheckpointError(f"[train] init_from {source.path}: {name} is {list(value.shape)} there and "
                                  f"{list(shape)} here; use the source's [model] settings")
        state[key] = value
        state[f"adam_m.{name}"] = np.zeros(shape, np.float32)
        state[f"adam_v.{name}"] = np.zeros(shape, np.float32)
    return state
