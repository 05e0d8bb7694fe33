"""A run directory whose `latest` pointer is gone (deleted, or lost when the directory was copied) still holds
the run: `trainer run` resumes from its newest checkpoint that verifies and says so, and its pruning never
deletes a checkpoint this run did not write. From the CLI, as a user meets it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch  # noqa: F401  (a pinned test dependency: a missing torch is an error, not a skip)

REPO = Path(__file__).resolve().parents[2]
EIGHT = {"train": {"max_iters": 8, "ckpt_interval": 4, "keep_ckpts": 2, "sample_tokens": 0}}


def _run(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", "run", str(config), "--backend", "torch", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def _configs(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == "config"]


def _flip(path: Path, at: int = 200) -> None:
    blob = bytearray(path.read_bytes())
    blob[at] ^= 0xFF
    path.write_bytes(bytes(blob))


def test_without_latest_the_run_resumes_from_the_newest_checkpoint_that_verifies(make_config, tmp_path):
    config = make_config(**EIGHT)
    run_dir = tmp_path / "runs" / "tiny"
    assert _run(config).returncode == 0
    (run_dir / "latest").unlink()
    _flip(run_dir / "ckpt-8" / "model.safetensors")  # the newest no longer verifies
    # A checkpoint at a step this run never saves (damaged too, so it is not the one resumed from): not this
    # run's to prune.
    shutil.copytree(run_dir / "ckpt-4", run_dir / "ckpt-6")
    _flip(run_dir / "ckpt-6" / "model.safetensors")

    done = _run(config, "--train.max_iters=12")
    assert done.returncode == 0, done.stderr
    assert "has no `latest` pointer: resuming from ckpt-4, the newest checkpoint that verifies" in done.stderr
    assert "skipped ckpt-8: " in done.stderr and "ckpt-6: " in done.stderr and "SHA-256" in done.stderr
    resumed = _configs(run_dir)[-1]
    assert resumed["start_step"] == 4 and resumed["resumed_from"] == "ckpt-4"
    assert (run_dir / "latest").read_text().strip() == "ckpt-12"
    # keep_ckpts = 2 of this run's own (ckpt-4 from before the resume, ckpt-8 and ckpt-12 written since);
    # ckpt-6 is not this run's, so it stays.
    assert sorted(p.name for p in run_dir.glob("ckpt-*")) == ["ckpt-12", "ckpt-6", "ckpt-8"]


def test_without_latest_and_no_checkpoint_that_verifies_nothing_is_overwritten(make_config, tmp_path):
    config = make_config(**EIGHT)
    run_dir = tmp_path / "runs" / "tiny"
    assert _run(config).returncode == 0
    (run_dir / "latest").unlink()
    for name in ("ckpt-4", "ckpt-8"):
        _flip(run_dir / name / "model.safetensors")
    before = {p.name: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}

    done = _run(config, "--train.max_iters=12")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "no `latest` pointer and none of its checkpoints verifies" in done.stderr
    assert "ckpt-8" in done.stderr and "ckpt-4" in done.stderr and "new --run.name" in done.stderr
    after = {p.name: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before


def test_resume_never_counts_checkpoints_without_latest(make_config, tmp_path):
    config = make_config(**EIGHT)
    run_dir = tmp_path / "runs" / "tiny"
    assert _run(config).returncode == 0
    (run_dir / "latest").unlink()
    done = _run(config, "--resume", "never")
    assert done.returncode == 2 and "already holds a run (latest checkpoint ckpt-8)" in done.stderr


def test_eval_uses_the_newest_checkpoint_that_verifies(make_config, tmp_path):
    config = make_config(**EIGHT)
    run_dir = tmp_path / "runs" / "tiny"
    assert _run(config).returncode == 0
    (run_dir / "latest").unlink()
    done = subprocess.run([sys.executable, "-m", "trainer", "eval", "--run", str(run_dir), "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["checkpoint"] == "ckpt-8" and "using ckpt-8" in done.stderr
