"""`trainer config` (resolved config and model size, no training) and `trainer configs` (the shipped ones)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from trainer.backend import count_params
from trainer.config import load_config

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_config_prints_the_resolved_config_and_the_size():
    done = _cli("config", "configs/alpha-8l.toml", "--train.batch_size=4", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    cfg = load_config(REPO / "configs/alpha-8l.toml", ["train.batch_size=4"])
    assert report["config"]["train"]["batch_size"] == 4
    assert report["config"]["schedule"]["lr_decay_iters"] == cfg.schedule.lr_decay_iters  # defaults filled in
    assert report["size"]["parameters"] == count_params(cfg.model)
    assert report["size"]["fixed_mib"] == 16 * count_params(cfg.model) / (1 << 20)
    text = _cli("config", "configs/llama-tiny.toml").stdout
    assert "[model]" in text and "# parameters" in text and "# FLOPs per token" in text


def test_config_refuses_bad_input_in_one_line():
    done = _cli("config", "configs/llama-tiny.toml", "--model.n_head=7")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "n_head" in done.stderr


def test_configs_lists_every_shipped_config():
    done = _cli("configs")
    assert done.returncode == 0
    listed = [line.split()[0] for line in done.stdout.splitlines()]
    assert listed == sorted(f"configs/{p.name}" for p in (REPO / "configs").glob("*.toml"))
    assert all(len(line.split(maxsplit=1)) == 2 for line in done.stdout.splitlines())  # each has a description
