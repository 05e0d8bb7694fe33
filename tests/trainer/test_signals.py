"""A live trainer process: SIGUSR1 checkpoints and continues, a second trainer on the same run dir is refused,
SIGTERM checkpoints and exits 0, and resuming from there reproduces the uninterrupted run exactly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import torch  # noqa: F401  (a pinned test dependency: a missing torch is an error, not a skip)

from telemetry.events import read_events
from tests.conftest import REPO, run_python
from trainer.checkpoint import latest_path, load_checkpoint


def wait_for(predicate, timeout: float = 60.0, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"trainer exited early ({proc.returncode}): {proc.communicate()[1][-2000:]}")
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_signals_lock_and_resume(make_config, tmp_path):
    sections = {"train": {"max_iters": 60, "ckpt_interval": 0, "eval_interval": 0, "sample_tokens": 0}}
    cfg = make_config("live", **sections)
    run_dir = tmp_path / "runs/live"
    env = dict(os.environ, HELIOS_STEP_DELAY_S="0.1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "run", str(cfg), "--backend", "torch"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def steps():
            return [e for e in read_events(run_dir) if e["event"] == "step"]

        wait_for(lambda: len(steps()) >= 3, proc=proc)
        proc.send_signal(signal.SIGUSR1)
        saved = wait_for(lambda: [e for e in read_events(run_dir) if e["event"] == "ckpt"], proc=proc)
        assert saved[0]["reason"] == "signal"
        assert load_checkpoint(run_dir / saved[0]["path"]).step == saved[0]["step"]

        second = run_python("-m", "trainer", "run", str(cfg), "--backend", "torch", timeout=60)
        assert second.returncode == 2 and "in use by another trainer" in second.stderr
        assert f"pid {proc.pid}" in second.stderr

        n_before = len(steps())
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    end = [e for e in read_events(run_dir) if e["event"] == "end"][-1]
    assert end["status"] == "stopped" and end["reason"] == "SIGTERM"
    ckpt = load_checkpoint(latest_path(run_dir))
    assert n_before <= ckpt.step < 60 and ckpt.step == end["step"]
    assert len(steps()) == ckpt.step  # no step ran past the checkpoint

    # Resume here (no delay) and compare with an uninterrupted run of the same config, both in fresh processes
    # like the interrupted one: run inside this pytest process after thousands of other tests, the uninterrupted
    # torch run once differed from the subprocess in the last bit of step 2 (process-global state left behind
    # by an earlier test; not pinned down), which is not what this test is about.
    for config in (cfg, make_config("whole", **sections)):
        done = run_python("-m", "trainer", "run", str(config), "--backend", "torch", timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
    got = [(e["step"], e["loss"]) for e in read_events(run_dir) if e["event"] == "step"]
    want = [(e["step"], e["loss"]) for e in read_events(tmp_path / "runs/whole") if e["event"] == "step"]
    assert got == want and len(want) == 60
