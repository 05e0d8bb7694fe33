"""Shared pieces of the reliability suite: a tiny model config for the helios backend on lavapipe, a CLI
runner, and run-directory snapshots (to prove a failed command changed nothing)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.trainer.conftest import make_corpus, to_toml

# 1 layer, 16 wide, block 8, batch 2, vocab 257 (byte-level: BPE with no merges): ~7.5k parameters, about
# 10-15 ms a step on lavapipe once its pipelines are cached.
TINY = {
    "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8, "vocab_size": 257},
    "optim": {"lr": 3e-3},
    "schedule": {"warmup_iters": 2},
    "train": {"batch_size": 2, "max_iters": 8, "eval_interval": 0, "eval_iters": 1, "log_interval": 1000,
              "ckpt_interval": 4, "keep_ckpts": 2, "sample_tokens": 0, "seed": 11},
}


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """A ~45 KB text file whose tokenizer cache the whole suite shares."""
    path = tmp_path_factory.mktemp("reliability-corpus") / "verse.txt"
    path.write_text(make_corpus(), encoding="utf-8")
    return path


def write_config(path: Path, corpus: Path, out_dir: Path, name: str, **sections: dict) -> Path:
    """A TINY config at `path` whose run directory is out_dir/name; `sections` update TINY's tables."""
    doc = {k: dict(v) for k, v in TINY.items()}
    doc["data"] = {"path": str(corpus)}
    doc["run"] = {"out_dir": str(out_dir), "name": name}
    for section, updates in sections.items():
        doc.setdefault(section, {}).update(updates)
    path.write_text(to_toml(doc), encoding="utf-8")
    return path


@pytest.fixture
def tiny_config(tmp_path, corpus):
    """make(name="tiny", **section_updates) -> a TINY config whose run dir is tmp_path/runs/<name>."""
    def make(name: str = "tiny", **sections: dict) -> Path:
        return write_config(tmp_path / f"{name}.toml", corpus, tmp_path / "runs", name, **sections)
    return make


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a trainer subprocess: unbuffered, test hooks cleared unless given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HELIOS_INJECT", "HELIOS_STEP_DELAY",
                                                                       "HELIOS_CKPT_DELAY"))}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def trainer_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 180,
                entry: tuple[str, ...] = ("-m", "trainer")) -> subprocess.CompletedProcess:
    """Run `python -m trainer ARGS` (or another entry) from the repo root; text output captured."""
    return subprocess.run([sys.executable, *entry, *args], cwd=REPO, env=env or child_env(), capture_output=True,
                          text=True, timeout=timeout)


def snapshot(root: Path) -> dict[str, str]:
    """relative path -> SHA-256 of every file under root (the lock file excluded: a refused run may take it)."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"}
