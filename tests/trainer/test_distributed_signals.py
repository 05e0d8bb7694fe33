"""Signals to a `trainer run --nproc 2` launcher, with the real mpiexec and real signals, as `kill`, `timeout`,
systemd, Slurm and a terminal send them: SIGUSR1 checkpoints every rank and goes on; SIGTERM and Ctrl-C
checkpoint once and stop every rank, and the launcher exits when they do; a second Ctrl-C ends every rank at
once and the launcher exits 130 with one line; a SIGKILLed launcher (or a killed
MPI proxy) leaves no rank behind. Process trees are read from /proc."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer.checkpoint import load_latest

REPO = Path(__file__).resolve().parents[2]
TRAIN = {"batch_size": 4, "max_iters": 400, "ckpt_interval": 0, "eval_interval": 0, "sample_tokens": 0}


pytestmark = pytest.mark.usefixtures("needs_mpiexec")


def _reap(job, tree) -> None:
    """End what a test's job left running: the launcher, then every process of its tree still alive."""
    if job.poll() is None:
        job.kill()
        job.communicate()
    for pid in [p for p in tree if _alive(p)]:
        os.kill(pid, signal.SIGKILL)


def _launch(config: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HELIOS_INJECT", "PMI_"))}
    env.update(PYTHONUNBUFFERED="1", HELIOS_STEP_DELAY_S="0.1")  # steps slow enough to signal mid-run
    return subprocess.Popen([sys.executable, "-m", "trainer", "run", str(config), "--nproc", "2"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _events(run_dir: Path, kind: str) -> list[dict]:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [e for e in map(json.loads, filter(None, lines)) if e["event"] == kind]


def _wait_for(predicate, job: subprocess.Popen, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if job.poll() is not None:
            raise AssertionError(f"launcher exited early ({job.returncode}): {job.communicate()[1][-2000:]}")
        time.sleep(0.1)
    raise AssertionError("timed out")


def _parents() -> dict[int, int]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return out


def _descendants(root: int) -> list[int]:
    """Every live process below `root` (mpiexec, its proxy, the ranks)."""
    parents, found = _parents(), []
    for pid in parents:
        p, hops = pid, 0
        while p in parents and p != root and hops < 10:
            p, hops = parents[p], hops + 1
        if p == root and pid != root:
            found.append(pid)
    return found


def _rank_pids(pids: list[int]) -> list[int]:
    ranks = []
    for pid in pids:
        try:
            environ = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(v.startswith(b"PMI_RANK=") for v in environ):
            ranks.append(pid)
    return ranks


def _alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by its new parent, counts as gone)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _job_tree(job: subprocess.Popen, run_dir: Path) -> list[int]:
    """mpiexec, the proxy and both ranks, once both ranks train."""
    _wait_for(lambda: len(_events(run_dir, "step")) >= 2, job)
    tree = _wait_for(lambda: (pids := _descendants(job.pid)) and len(_rank_pids(pids)) == 2 and pids, job)
    return tree


def _wait_all_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.parametrize("stop,code", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_signals_to_the_launcher_reach_every_rank_and_it_exits_with_them(make_config, tmp_path, stop, code):
    config = make_config("sig", train=TRAIN)
    run_dir = tmp_path / "runs/sig"
    job = _launch(config)
    try:
        tree = _job_tree(job, run_dir)
        job.send_signal(signal.SIGUSR1)  # checkpoint and go on
        saved = _wait_for(lambda: _events(run_dir, "ckpt"), job)
        assert saved[0]["reason"] == "signal"
        stepped = len(_events(run_dir, "step"))
        _wait_for(lambda: len(_events(run_dir, "step")) > stepped, job)  # still training
        job.send_signal(stop)
        out, err = job.communicate(timeout=90)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert job.returncode == code, err[-3000:]
    assert "Traceback" not in err
    assert not _wait_all_gone(tree, 5), "a rank, the proxy or mpiexec outlived the launcher"
    ckpts, end = _events(run_dir, "ckpt"), _events(run_dir, "end")
    assert [c["reason"] for c in ckpts] == ["signal", stop.name]  # the stop was agreed on: one checkpoint
    assert end[-1]["status"] == "stopped" and end[-1]["reason"] == stop.name
    assert load_latest(run_dir).step == end[-1]["step"] == ckpts[-1]["step"] < 400
    assert f"resume with: {shlex.quote(sys.executable)} -m trainer run {config} --nproc 2" in out
    assert out.count("run directory:") == 1


def test_a_second_ctrl_c_ends_every_rank_at_once_and_the_launcher_exits_130_with_one_line(make_config, tmp_path):
    config = make_config("twice", train=TRAIN)
    run_dir = tmp_path / "runs/twice"
    job = _launch(config)
    try:
        tree = _job_tree(job, run_dir)
        job.send_signal(signal.SIGINT)  # a terminal's Ctrl-C, twice
        time.sleep(0.05)
        job.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, err = job.communicate(timeout=30)
        took = time.monotonic() - sent
        left = _wait_all_gone(tree, 5)
    finally:
        _reap(job, tree)
    assert job.returncode == 130, err[-3000:]
    assert not left, f"processes outlived their launcher: {left}"
    assert took < 5.0
    assert err.strip().splitlines()[-1].startswith("trainer: interrupted again: the ranks were stopped at once")
    for noise in ("[mpiexec@", "[proxy:", "a rank died", "Traceback", "BAD TERMINATION"):
        assert noise not in err, err[-3000:]


def test_a_sigkilled_launcher_leaves_no_rank_behind_and_they_checkpoint(make_config, tmp_path):
    config = make_config("killed", train=TRAIN)
    run_dir = tmp_path / "runs/killed"
    job = _launch(config)
    try:
        tree = _job_tree(job, run_dir)
        job.kill()  # SIGKILL: the launcher cannot pass anything on; the kernel's parent-death signal does
        job.wait(timeout=30)
        left = _wait_all_gone(tree, 30)
    finally:
        for pid in [p for p in tree if _alive(p)]:  # never leave a stray trainer behind in the test run
            os.kill(pid, signal.SIGKILL)
        job.communicate()
    assert not left, f"processes outlived their launcher: {left}"
    ckpts = _events(run_dir, "ckpt")
    assert [c["reason"] for c in ckpts] == ["SIGTERM"]  # mpiexec got SIGTERM and passed it on
    assert load_latest(run_dir).step == ckpts[0]["step"]


def test_ranks_whose_mpi_proxy_dies_end_with_it(make_config, tmp_path):
    config = make_config("orphaned", train=TRAIN)
    run_dir = tmp_path / "runs/orphaned"
    job = _launch(config)
    try:
        tree = _job_tree(job, run_dir)
        ranks = _rank_pids(tree)
        proxy = _parents()[ranks[0]]
        os.kill(proxy, signal.SIGKILL)
        _, err = job.communicate(timeout=60)
        left = _wait_all_gone(ranks, 30)
    finally:
        _reap(job, tree)
    assert not left, f"ranks outlived their MPI proxy: {left}"
    assert job.returncode not in (0, 2, 130) and "a rank died or was killed" in err
