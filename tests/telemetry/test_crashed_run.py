"""A run whose trainer died without an `end` event (a crash before its first step leaves an empty log) is
reported as crashed by `telemetry summary`, and `telemetry watch --plain` says so and exits instead of waiting
in silence. Runs without a lock file (copied from elsewhere) stay "running" while events may still come."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import run_python
from tests.telemetry.runlog import run_events, write_run


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _crashed_run(root, events=()):
    run = root / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run / ".lock").write_text(f"{_dead_pid()}\n")
    return run


def test_summary_of_a_crashed_run_with_an_empty_log_says_crashed(tmp_path):
    run = _crashed_run(tmp_path)
    proc = run_python("-m", "telemetry", "summary", str(run), "--json", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "crashed"
    text = run_python("-m", "telemetry", "summary", str(run), timeout=60).stdout
    assert "(crashed, 0 resume(s))" in text and "running" not in text


def test_summary_of_a_run_killed_mid_training_says_crashed(tmp_path):
    run = _crashed_run(tmp_path, run_events(6)[:-1])  # steps, no `end`
    proc = run_python("-m", "telemetry", "summary", str(run), "--json", timeout=60)
    assert json.loads(proc.stdout)["status"] == "crashed" and json.loads(proc.stdout)["step"] == 6


def test_a_live_trainer_and_an_unknown_one_are_running(tmp_path):
    import os

    live = _crashed_run(tmp_path, run_events(4)[:-1])
    (live / ".lock").write_text(f"{os.getpid()}\n")  # this test's own process stands in for a live trainer
    assert json.loads(run_python("-m", "telemetry", "summary", str(live), "--json").stdout)["status"] == "running"
    copied = write_run(tmp_path / "copied", run_events(4)[:-1])  # no lock file: nothing says it died
    assert json.loads(run_python("-m", "telemetry", "summary", str(copied), "--json").stdout)["status"] == "running"


def test_watch_plain_on_a_crashed_run_says_so_and_exits(tmp_path):
    run = _crashed_run(tmp_path)
    proc = run_python("-m", "telemetry", "watch", str(run), "--plain", "--interval", "0.2", timeout=30)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "is gone and the log has no `end` event: it crashed or was killed" in proc.stderr
    steps = _crashed_run(tmp_path / "b", run_events(5)[:-1]) if (tmp_path / "b").mkdir() is None else None
    proc = run_python("-m", "telemetry", "watch", str(steps), "--plain", "--interval", "0.2", timeout=30)
    assert proc.returncode == 1 and proc.stdout.splitlines()[-1].startswith("step 5 |"), proc.stdout
