"""Telemetry CLI robustness (issue 16, item 5): bad input ends in one line and exit 2; watch works in a pipe;
the plot labels and marks what it shows."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from telemetry.plot import build_figure, memory_note, resume_steps
from telemetry.watch import wait_for_run
from tests.conftest import REPO, run_python
from tests.telemetry.runlog import config_event, run_events, step_event, write_run


def _one_error_line(proc, needle: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("telemetry: error: "), proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr


def test_watch_prints_plain_lines_when_stdout_is_not_a_tty(tmp_path):
    run = write_run(tmp_path / "run", run_events(12, skip_at=5))
    proc = run_python("-m", "telemetry", "watch", str(run), timeout=30)  # stdout is a pipe: plain lines
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("config: helios on llvmpipe")
    assert sum(line.startswith("step ") and "| loss " in line for line in lines) == 12
    assert "step 5 skip: nan" in proc.stdout and "step 10 eval: val loss" in proc.stdout
    assert lines[-1] == "step 12 end: done"  # and it returned at the run's end instead of waiting forever
    assert "\x1b[" not in proc.stdout  # no terminal control codes in a log file


def test_watch_plain_follows_a_resumed_run_to_its_last_end(tmp_path):
    events = run_events(10)[:-1] + [{"event": "end", "t": 5.0, "step": 10, "status": "stopped"}]
    events += [config_event(start_step=10, max_iters=12), step_event(11), step_event(12)]
    run = write_run(tmp_path / "run", events)
    log = run / "metrics.jsonl"

    def finish():
        time.sleep(1.0)
        with open(log, "a") as f:
            f.write('{"event": "end", "t": 9.0, "step": 12, "status": "done"}\n')

    threading.Thread(target=finish, daemon=True).start()
    proc = run_python("-m", "telemetry", "watch", str(run), "--interval", "0.2", timeout=30)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "step 12 end: done", proc.stdout


def test_watch_on_a_mistyped_run_directory(tmp_path):
    # The parent folder does not exist either: a typo, reported at once.
    start = time.monotonic()
    proc = run_python("-m", "telemetry", "watch", str(tmp_path / "rnus" / "shakespeare"), timeout=30)
    _one_error_line(proc, "neither the run directory nor its parent")
    # The parent exists: the run may be about to start, so watch waits (saying so), then gives up.
    proc = run_python("-m", "telemetry", "watch", str(tmp_path / "shakespear"), "--wait", "0.5", timeout=30)
    assert proc.returncode == 2 and "waiting up to 0.5 s" in proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("telemetry: error: ") and "does not exist (waited 0.5 s)" in (
        proc.stderr)
    assert time.monotonic() - start < 25
    proc = run_python("-m", "telemetry", "watch", str(tmp_path / "shakespear"), "--once", timeout=30)
    _one_error_line(proc, "does not exist")


def test_wait_for_run_returns_once_the_trainer_creates_it(tmp_path):
    run = tmp_path / "run"
    threading.Timer(0.3, run.mkdir).start()
    assert wait_for_run(run, wait_s=10, poll_s=0.05, out=open(os.devnull, "w")) is None  # noqa: SIM115


@pytest.mark.parametrize("command", ["summary", "plot", "watch"])
def test_a_file_that_is_not_telemetry_is_one_error_line(tmp_path, command):
    text = tmp_path / "notes.txt"
    text.write_text("".join(f"line {i} of an ordinary text file\n" for i in range(3000)))
    args = ["--once"] if command == "watch" else []
    proc = run_python("-m", "telemetry", command, str(text), *args, timeout=60)
    _one_error_line(proc, "is not a helios metrics log")
    bad_run = tmp_path / "run"
    bad_run.mkdir()
    (bad_run / "metrics.jsonl").write_bytes(os.urandom(4096))
    proc = run_python("-m", "telemetry", command, str(bad_run), *args, timeout=60)
    _one_error_line(proc, "is not a helios metrics log")


def test_plot_output_errors(tmp_path):
    run = write_run(tmp_path / "run", run_events(5))
    proc = run_python("-m", "telemetry", "plot", str(run), "-o", str(tmp_path / "x.txt"), timeout=60)
    _one_error_line(proc, "give a path ending in .png")
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a folder")
    proc = run_python("-m", "telemetry", "plot", str(run), "-o", str(blocker / "plot.png"), timeout=60)
    _one_error_line(proc, f"cannot write {blocker / 'plot.png'}: {blocker} is a file, not a folder")
    if os.geteuid() != 0:  # root writes anywhere: permissions cannot be tested as root
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        proc = run_python("-m", "telemetry", "plot", str(run), "-o", str(locked / "plot.png"), timeout=60)
        _one_error_line(proc, "Permission denied")
    assert {p.name for p in tmp_path.iterdir()} <= {"file", "locked", "run"}  # nothing half-written
    assert blocker.read_text() == "a file, not a folder" and sorted(p.name for p in run.iterdir()) == [
        "metrics.jsonl"]


def test_summary_labels_its_numbers(tmp_path):
    run = write_run(tmp_path / "run", run_events(20, skip_at=None))
    proc = run_python("-m", "telemetry", "summary", str(run), timeout=30)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("train loss"))
    assert " first -> " in line and "mean of last 10 steps" in line and "(min " in line


def test_plot_before_step_one_does_not_guess_the_backend():
    crashed = [config_event()]  # a helios run that died before its first step
    assert memory_note(crashed) == "no steps logged"
    torch_run = [dict(config_event(), backend="torch"), {"event": "step", "t": 1.0, "step": 1, "loss": 2.0}]
    assert memory_note(torch_run) == "no device memory counters\n(torch backend)"
    fig = build_figure(crashed, "crashed")
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "no steps logged" in texts and not any("torch" in t for t in texts)


def test_plot_marks_resumes_reads_grad_norm_plainly_and_has_no_memory_twin_axis():
    events = run_events(30)[:-1] + [config_event(start_step=20)] + [step_event(i) for i in range(21, 31)]
    assert resume_steps(events) == [20]
    fig = build_figure(events, "resumed")
    fig.canvas.draw()
    assert len(fig.axes) == 6  # 2x3 panels, no twin axis
    for ax in fig.axes:
        assert any(list(line.get_xdata()) == [20, 20] and line.get_linestyle() == ":" for line in ax.lines), ax.title
    grad = next(ax for ax in fig.axes if ax.get_title() == "gradient norm")
    labels = [t.get_text() for t in grad.get_yticklabels() + grad.get_yticklabels(minor=True) if t.get_text()]
    assert labels and all("$" not in t and "^" not in t for t in labels), labels  # 0.5, 1, 2: not 10^0
    assert all(float(t) > 0 for t in labels)
    mem = next(ax for ax in fig.axes if ax.get_title().startswith("device memory"))
    assert [line.get_label() for line in mem.lines if not line.get_label().startswith("_")] == [
        "pool reserved", "peak in use", "resumed"]


def test_many_malformed_lines_in_a_real_log_give_a_bounded_number_of_warnings(tmp_path):
    events = run_events(30)
    run = write_run(tmp_path / "run", events)
    with open(run / "metrics.jsonl", "a") as f:
        f.write("garbage\n" * 500)
    proc = run_python("-m", "telemetry", "summary", str(run), timeout=30)
    assert proc.returncode == 0 and "step 30 / 30" in proc.stdout
    assert len(proc.stderr.splitlines()) == 11 and "more malformed lines skipped" in proc.stderr


def test_summary_into_a_closed_pipe_ends_quietly(tmp_path):
    """`telemetry summary RUN | head -c 10`: the reader is gone before the summary is written; no traceback."""
    run = write_run(tmp_path / "run", run_events(12))
    read, write = os.pipe()
    os.close(read)  # every write to the pipe now fails with EPIPE (BrokenPipeError in Python)
    try:
        proc = subprocess.run([sys.executable, "-m", "telemetry", "summary", str(run)], stdout=write,
                              stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=60)
    finally:
        os.close(write)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
