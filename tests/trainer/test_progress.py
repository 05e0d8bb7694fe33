"""No silent minutes: kernel compilation shows as progress, the ETA ignores the cold first step, and a signal
is acknowledged at once with the command that resumes the run."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import helios.runtime as rt
from trainer import progress as P

REPO = Path(__file__).resolve().parents[2]


def test_eta_comes_from_warm_steps_only(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(P.time, "monotonic", lambda: now[0])
    clock = P.StepClock()
    assert clock.eta(1, 11) == "-"  # the first (cold) step: nothing to extrapolate from
    now[0] += 2.0
    assert clock.eta(2, 11) == "0m18s"  # 2 s per warm step, 9 to go
    now[0] += 2.0
    assert clock.eta(3, 11) == "0m16s"
    assert clock.eta(11, 11) == "0m00s"


def test_compile_progress_appears_once_compiling_is_slow():
    out = io.StringIO()
    plain = P.PlainProgress(10, stream=out)
    for k in range(1, 10):
        plain.compiling(f"k{k}", k, 5.0)  # a warm start: fast, silent
    plain.compiling("k10", 10, 5.0)
    assert out.getvalue() == ""
    for k in range(11, 21):
        plain.compiling(f"k{k}", k, 300.0)
    assert "compiling kernels: 20 so far, 3 s (now k20)" in out.getvalue()


def test_the_runtime_reports_each_new_pipeline():
    from helios.kernels import elementwise

    seen = []
    runtime = rt.get_runtime()
    runtime.on_compile = lambda name, count, ms: seen.append((name, count, ms))
    try:
        x = rt.from_numpy(np.arange(8, dtype=np.float32))
        elementwise.scale(x, 3.0)
        elementwise.scale(x, 2.0)  # the same pipeline: no second report
        rt.sync()
    finally:
        runtime.on_compile = None
    assert len({name for name, _, _ in seen}) == len(seen)
    assert all(ms >= 0 and count >= 1 for _, count, ms in seen)


def test_a_signal_is_acknowledged_at_once_and_the_resume_command_printed(make_config, tmp_path):
    config = make_config("sig", train={"max_iters": 500, "log_interval": 1, "sample_tokens": 0})
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HELIOS_STEP_DELAY_S": "0.2"}
    job = subprocess.Popen([sys.executable, "-m", "trainer", "run", str(config), "--optim.lr=0.002"], cwd=REPO,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = job.stdout.readline()
        lines.append(line)
        if line.startswith("step 2/") or not line:
            break
    job.send_signal(signal.SIGINT)
    out, err = job.communicate(timeout=120)
    text = "".join(lines) + out
    assert "SIGINT: stopping after this step with a checkpoint" in text
    assert f"resume with: {sys.executable} -m trainer run {config} --optim.lr=0.002" in text  # the Python used
    assert job.returncode == 130 and "Traceback" not in err
