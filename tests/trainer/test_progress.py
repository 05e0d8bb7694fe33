"""No silent minutes: kernel compilation shows as progress, the ETA ignores the cold first step, and a signal
is acknowledged at once with the command that resumes the run."""

from __future__ import annotations

import io
import os
import re
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
    from helios.kernels.pointwise import elementwise

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


def _run_in_a_terminal(argv: list[str], stop_at: bytes, timeout: float = 240) -> tuple[str, int]:
    """Run argv under a pseudo-terminal 200 columns wide, SIGTERM it once `stop_at` is on the screen; returns
    (everything it wrote, exit code)."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HELIOS_STEP_DELAY_S": "0.2", "COLUMNS": "200", "TERM": "xterm"}
    pid, fd = pty.fork()
    if pid == 0:  # the child: the trainer, on the terminal
        os.chdir(REPO)
        os.execve(sys.executable, [sys.executable, *argv], env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    out, sent, deadline = b"", False, time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not sent and stop_at in out:
            os.kill(pid, signal.SIGTERM)
            sent = True
        if select.select([fd], [], [], 0.1)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return out.decode("utf-8", "replace"), os.waitstatus_to_exitcode(status)


def test_in_a_terminal_step_lines_scroll_above_the_bar_and_it_keeps_up_with_the_checkpoint(make_config):
    config = make_config("tty", train={"max_iters": 200, "log_interval": 2, "eval_interval": 0, "sample_tokens": 0,
                                       "ckpt_interval": 0})
    screen, code = _run_in_a_terminal(["-m", "trainer", "run", str(config)], stop_at=b"step 6/200 |")
    assert code == 0, screen[-3000:]
    # Lines printed above the live bar end in a newline (scrollback); the bar's redraws end in a carriage return.
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen)
    printed = [line.split("\r")[-1] for line in plain.split("\r\n")]
    logged = [line for line in printed if line.startswith("step ") and "| loss " in line]
    assert [line.split(" |")[0] for line in logged[:4]] == ["step 1/200", "step 2/200", "step 4/200", "step 6/200"]
    assert all("| MFU " in line and "tok/s" in line for line in logged)
    ckpt = re.search(r"step (\d+): checkpoint ckpt-\1 \(SIGTERM\)", plain)
    assert ckpt, plain[-3000:]
    # The last frame of the bar drawn before the checkpoint line shows the checkpoint's step.
    frames = re.findall(r"(\d+)/200", plain[:ckpt.start()])
    assert frames[-1] == ckpt.group(1), (frames[-5:], ckpt.group(0))


def test_configs_lists_each_description_as_a_whole_sentence():
    done = subprocess.run([sys.executable, "-m", "trainer", "configs"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    rows = dict(line.split(None, 1) for line in done.stdout.splitlines())  # a pipe: one line per config
    assert set(rows) == {str(p.relative_to(REPO)) for p in (REPO / "configs").glob("*.toml")}
    assert all(about.endswith(".") and about.count("(") == about.count(")") for about in rows.values()), rows
    assert rows["configs/gpu-gpt2-124m.toml"].endswith("with a byte-level BPE trained on the data), batch 8.")
    assert rows["configs/shakespeare.toml"].endswith("with the loss clearly falling and a readable sample at the end.")


def test_configs_wraps_at_whole_words_under_its_column():
    from trainer.inspect_config import first_sentence, format_configs

    assert first_sentence("A (see e.g. 0.76 of it. Really). B. C") == "A (see e.g. 0.76 of it. Really)."
    text = format_configs([("configs/a.toml", "word " * 30 + "end.")], width=60)
    lines = text.splitlines()
    assert len(lines) > 1 and all(len(line) <= 60 for line in lines)
    assert all(line.startswith(" " * len("configs/a.toml  ")) for line in lines[1:])
    assert " ".join(line[len("configs/a.toml  "):] for line in lines) == "word " * 30 + "end."
