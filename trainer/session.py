"""Run-directory plumbing shared by the CLI commands: creating/checking it, the resolved config, loading a run."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainer import run_artifacts
from trainer.backend import Backend, create_backend
from trainer.checkpoint import load_chosen
from trainer.config import Config, config_from_dict
from trainer.data import write_text_atomic
from trainer.errors import CheckpointError, ConfigError, DataError, TrainerError
from trainer.loop import Trainer, check_checkpoint_matches
from trainer.tokens import PreparedData, prepare_data

RESOLVED = "resolved.json"


def prepare_run_dir(run_dir: Path) -> None:
    """Create the run directory and prove it is writable, or raise a TrainerError saying why not."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=run_dir, prefix=".write-probe-")
        os.close(fd)
        Path(probe).unlink(missing_ok=True)  # the lock holder may be clearing stale temps right now
    except OSError as exc:
        raise TrainerError(f"run directory {run_dir} is not writable: {exc.strerror or exc}; "
                           "set [run] out_dir/name to a writable place") from None


def remove_if_unused(run_dir: Path) -> bool:
    """Remove a run directory that holds nothing but its lock file (a run refused at the data or init_from
    stage, before writing anything); True if it was removed. Call it after releasing the lock."""
    from trainer.runlock import LOCK_FILE

    try:
        if {p.name for p in run_dir.iterdir()} != {LOCK_FILE}:
            return False
        (run_dir / LOCK_FILE).unlink()
        run_dir.rmdir()
    except OSError:  # another trainer is starting in it, or it is not ours to remove: leave it
        return False
    return True


def write_resolved(run_dir: Path, cfg: Config, backend_kind: str) -> None:
    """Save the fully resolved config (every default filled in) beside the checkpoints."""
    doc = {"backend": backend_kind, "config": cfg.to_dict()}
    try:
        write_text_atomic(run_dir / RESOLVED, json.dumps(doc, indent=2) + "\n")
    except OSError as exc:
        raise TrainerError(f"cannot write {run_dir / RESOLVED}: {exc.strerror or exc}") from None


def read_resolved(run_dir: Path) -> tuple[Config, str]:
    """The (config, backend name) a run directory was trained with."""
    path = run_dir / RESOLVED
    if not run_dir.is_dir():
        raise TrainerError(f"run directory {run_dir} does not exist")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        raw, kind = doc["config"], doc["backend"]
    except FileNotFoundError:
        raise TrainerError(f"{run_dir} is not a run directory (no {RESOLVED}); start one with `trainer run`") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} is corrupt: {exc}") from None
    return config_from_dict(raw, str(path)), kind


@dataclass
class LoadedRun:
    """A finished or running run, loaded read-only for sampling or evaluation."""

    cfg: Config
    backend: Backend
    data: PreparedData
    trainer: Trainer
    checkpoint: str
    note: str | None = None  # how the checkpoint was found, when `latest` did not name it


def load_run(run_dir: Path, backend_kind: str | None = None, val: bool = True, choice: str | None = None) -> LoadedRun:
    """Config, data and the latest checkpoint (or the one `choice` names: `--ckpt`) of a run directory, in a fresh
    backend (`val=False`: without reading the validation tokens, which sampling does not need)."""
    cfg, saved_kind = read_resolved(run_dir)
    kind = backend_kind or saved_kind
    ckpt, note = load_chosen(run_dir, choice, "using")
    if ckpt is None:
        raise CheckpointError(f"run {run_dir} has no checkpoint yet")
    # The run's own tokenizer and validation tokens (written by `trainer run`), so a moved run or one whose
    # text is gone still samples and evaluates; runs from before those files re-derive them from the data.
    data = run_artifacts.load(run_dir, ckpt.state.get("tokenizer_json"), val=val) or prepare_data(cfg)
    check_checkpoint_matches(cfg, data, ckpt)
    backend = create_backend(kind, cfg.model, cfg.optim, cfg.train.seed)
    trainer = Trainer(cfg, backend, kind, data, run_dir)
    trainer.restore(ckpt)
    return LoadedRun(cfg, backend, data, trainer, ckpt.path.name, note)


def training_tokens(loaded: LoadedRun) -> np.ndarray:
    """The run's training split, which the run directory does not keep: re-derived from the data."""
    if len(loaded.data.train):
        return loaded.data.train
    # A fine-tuning run tokenized its text with init_from's tokenizer, kept in its directory: so must this.
    given = loaded.data.tokenizer_path.read_text(encoding="utf-8") if loaded.cfg.train.init_from else None
    try:
        data = prepare_data(loaded.cfg, given)
    except TrainerError as exc:
        raise TrainerError(f"evaluating the training split needs the training data: {exc}") from None
    if data.tokenizer_hash != loaded.data.tokenizer_hash:
        raise TrainerError("the training text changed since this run (its tokenizer differs): only the "
                           "validation split, kept in the run directory, can be evaluated")
    return data.train


def held_out_tokens(loaded: LoadedRun, path: Path) -> np.ndarray:
    """The tokens of a held-out text (`trainer eval --data`: a file, .jsonl file or folder, read as [data] path
    is), cleaned like the training text and tokenized with the run's tokenizer."""
    from trainer.data import clean_text, read_texts
    from trainer.tokens import encode

    try:
        text, _ = read_texts([path], loaded.cfg.data.text_field)
    except TrainerError as exc:
        raise type(exc)(f"--data: {exc}") from None
    tokens = encode(loaded.data.tokenizer(), clean_text(text))
    need = loaded.cfg.model.block_size + 1
    if len(tokens) < need:
        raise DataError(f"--data {path} is {len(tokens)} tokens under the run's tokenizer: evaluating needs at least "
                        f"block_size + 1 = {need}")
    return tokens


def describe_data(data: PreparedData) -> dict[str, Any]:
    """A short JSON-able description of a prepared dataset (for `prepare` output)."""
    return {"text": data.text_label(), "cache": str(data.cache_dir), "tokenizer": str(data.tokenizer_path),
            "tokenizer_sha256": data.tokenizer_hash, "tokenizer_vocab": data.tokenizer_vocab,
            "train_tokens": len(data.train), "val_tokens": len(data.val), "dtype": str(data.train.dtype)}
