"""Paths in a config file are relative to the file, so a run resumes and finds its data from any working
directory; [data] cache_dir serves read-only data folders; resuming with changed settings says so."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.trainer.conftest import TINY, to_toml
from trainer.config import load_config

REPO = Path(__file__).resolve().parents[2]


def _trainer(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def _relative_config(tmp_path: Path, corpus: Path, **data) -> Path:
    project = tmp_path / "project"
    (project / "configs").mkdir(parents=True)
    shutil.copy(corpus, project / "text.txt")
    doc = {k: dict(v) for k, v in TINY.items()}
    doc["train"].update(max_iters=4, sample_tokens=0)
    doc["data"] = {"path": "../text.txt", **data}
    doc["run"] = {"out_dir": "../runs", "name": "rel"}
    config = project / "configs" / "rel.toml"
    config.write_text(to_toml(doc), encoding="utf-8")
    return config


def test_file_paths_are_relative_to_the_file_and_overrides_to_the_cwd(tmp_path, corpus):
    config = _relative_config(tmp_path, corpus)
    cfg = load_config(config)
    assert Path(cfg.data.path) == (config.parent / "../text.txt") and Path(cfg.run.out_dir) == config.parent / "../runs"
    typed = load_config(config, ["run.out_dir=elsewhere"])
    assert typed.run.out_dir == "elsewhere"


def test_a_run_resumes_from_any_working_directory(tmp_path, corpus):
    config = _relative_config(tmp_path, corpus)
    first = _trainer("run", str(config), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    other = tmp_path / "somewhere" / "else"
    other.mkdir(parents=True)
    again = _trainer("run", str(config), "--train.max_iters=6", cwd=other)
    assert again.returncode == 0, again.stderr
    assert "resumed from ckpt-4" in again.stdout
    assert not (other / "runs").exists() and not (other / "data").exists()


def test_cache_dir_serves_a_read_only_data_folder(tmp_path, corpus):
    config = _relative_config(tmp_path, corpus, cache_dir=str(tmp_path / "cache"))
    text_dir = tmp_path / "project"
    done = _trainer("run", str(config), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "cache" / "text.txt.helios").is_dir() and not (text_dir / "text.txt.helios").exists()


def test_resuming_with_changed_settings_warns(tmp_path, corpus):
    config = _relative_config(tmp_path, corpus)
    assert _trainer("run", str(config), cwd=tmp_path).returncode == 0
    done = _trainer("run", str(config), "--optim.lr=0.001", "--train.max_iters=6", cwd=tmp_path)
    assert done.returncode == 0
    assert "warning: resuming ckpt-4 with [optim] lr = 0.001 (it was trained with 0.003)" in done.stderr
    past = _trainer("run", str(config), "--train.max_iters=2", cwd=tmp_path)
    assert past.returncode == 0 and "nothing to train" in past.stderr
