"""A checkpoint is a checkpoint: a helios run evaluates, samples and resumes on the torch backend and a torch
run on helios, with the same evaluation loss both ways (the backends agree to float32 precision)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("trained_on,loaded_on", [("helios", "torch"), ("torch", "helios")])
def test_checkpoints_cross_backends(make_config, tmp_path, trained_on, loaded_on):
    config = make_config(f"from_{trained_on}", train={"max_iters": 4, "sample_tokens": 0})
    run_dir = tmp_path / "runs" / f"from_{trained_on}"
    assert _cli("run", str(config), "--backend", trained_on).returncode == 0
    own = _cli("eval", "--run", str(run_dir), "--json")
    other = _cli("eval", "--run", str(run_dir), "--backend", loaded_on, "--json")
    assert own.returncode == 0, own.stderr
    assert other.returncode == 0, other.stderr
    a, b = json.loads(own.stdout)["val_loss"], json.loads(other.stdout)["val_loss"]
    assert abs(a - b) <= 1e-4 * abs(a)
    sample = _cli("sample", "--run", str(run_dir), "--backend", loaded_on, "--tokens", "5")
    assert sample.returncode == 0, sample.stderr
    more = _cli("run", str(config), "--backend", loaded_on, "--train.max_iters=6")
    assert more.returncode == 0, more.stderr
