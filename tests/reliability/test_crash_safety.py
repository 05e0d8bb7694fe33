"""Crash safety: SIGKILL a training subprocess again and again, in every phase of its life (start-up, steps,
evals, each phase of a checkpoint write), resume each time with a plain `run`, and end with exactly the
parameters of an uninterrupted run. After every kill the newest checkpoint `latest` names is complete.

CI kills HELIOS_KILL_COUNT times (default 10 on helios, 3 on torch); the full count recorded in
docs/RELIABILITY.md is HELIOS_KILL_COUNT=30.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from telemetry.events import read_events
from tests.conftest import REPO
from tests.reliability.conftest import child_env, trainer_cli
from trainer.checkpoint import latest_path, list_checkpoints, load_checkpoint

# Phases a kill is aimed at; the checkpoint ones run with HELIOS_CKPT_DELAY_S so each phase lasts long enough.
PHASES = ("startup", "step", "ckpt_write", "ckpt_renamed", "random", "ckpt_pointed", "step", "eval")
CKPT_DELAY_S = "0.25"


def kill_count(backend: str) -> int:
    default = 10 if backend == "helios" else 3
    return int(os.environ.get("HELIOS_KILL_COUNT", default))


def sections(max_iters: int) -> dict:
    # Checkpoint every step (the most writes to be killed in), eval every 5 (a phase of its own), a sample at the
    # end; lr_decay_iters pinned so the schedule never depends on where a process stopped.
    return {"schedule": {"warmup_iters": 2, "lr_decay_iters": max_iters},
            "train": {"max_iters": max_iters, "ckpt_interval": 1, "keep_ckpts": 2, "eval_interval": 5,
                      "eval_iters": 2, "sample_tokens": 4}}


def latest_step(run_dir: Path) -> int:
    path = latest_path(run_dir)
    return -1 if path is None else int(path.name.split("-")[1])


def step_events(run_dir: Path) -> int:
    return sum(1 for e in read_events(run_dir) if e["event"] == "step")


def temps(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".ckpt-")) if run_dir.is_dir() else []


def inodes(run_dir: Path) -> set[tuple[int, int]]:
    """(step, inode) of each checkpoint dir: a re-saved ckpt-N replaces an orphan under the same name."""
    out = set()
    for step, path in list_checkpoints(run_dir):
        try:
            out.add((step, path.stat().st_ino))
        except FileNotFoundError:
            pass
    return out


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 60.0) -> bool:
    """Poll predicate every 2 ms until true (True) or the process exits (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.002)
    raise AssertionError(f"timed out waiting for a kill window (pid {proc.pid})")


def aim(phase: str, proc: subprocess.Popen, run_dir: Path, rng: random.Random) -> bool:
    """Wait for the phase's window; False when the run finished first."""
    start_latest, start_steps = latest_step(run_dir), step_events(run_dir)
    if phase == "startup":  # imports, device, data, checkpoint load: the first ~1-2 s
        time.sleep(rng.uniform(0.0, 1.2))
        return proc.poll() is None
    if phase == "random":
        time.sleep(rng.uniform(0.5, 3.0))
        return proc.poll() is None
    if phase == "step":
        n = rng.randint(1, 3)
        return wait_for(lambda: step_events(run_dir) >= start_steps + n, proc)
    if phase == "eval":  # right after an eval event: the next step or the eval's checkpoint
        evals = sum(1 for e in read_events(run_dir) if e["event"] == "eval")
        return wait_for(lambda: sum(1 for e in read_events(run_dir) if e["event"] == "eval") > evals, proc)
    if phase == "ckpt_write":  # this process's temp dir exists: model file written, state.json not yet
        return wait_for(lambda: any(name.endswith(f".tmp{proc.pid}") for name in temps(run_dir)), proc)
    if phase == "ckpt_renamed":  # a new ckpt-N in place, `latest` still names an older one
        before = inodes(run_dir)

        def renamed() -> bool:
            newest = latest_step(run_dir)
            return any(step > newest and (step, ino) not in before for step, ino in inodes(run_dir))
        return wait_for(renamed, proc)
    if phase == "ckpt_pointed":  # `latest` just moved; old checkpoints not yet pruned
        return wait_for(lambda: latest_step(run_dir) > start_latest, proc)
    raise ValueError(phase)


def check_run_dir(run_dir: Path) -> int:
    """Every invariant a kill must not break; returns the step `latest` names (-1: none yet)."""
    latest = latest_path(run_dir)  # raises CheckpointError if the pointer is corrupt or dangling
    for step, path in list_checkpoints(run_dir):
        ckpt = load_checkpoint(path)  # size + SHA-256 verified: never half-written under a final name
        assert ckpt.step == step, path
    if latest is None:
        return -1
    ckpt = load_checkpoint(latest)
    assert ckpt.step == int(latest.name.split("-")[1])
    return ckpt.step


def final_tensors(run_dir: Path) -> dict[str, np.ndarray]:
    return load_checkpoint(latest_path(run_dir)).tensors


def last_losses(run_dir: Path) -> dict[int, float]:
    """step -> loss of the last time the step ran (a killed step runs again after the resume)."""
    return {e["step"]: e["loss"] for e in read_events(run_dir) if e["event"] == "step"}


ENTRY = ("-m", "tests.reliability.faulty_trainer")


def kill_loop(backend: str, tiny_config, tmp_path: Path, kills: int, seed: int) -> dict[str, int]:
    # Room for every kill to land before the run ends: a late "random" kill may let ~50 steps through.
    max_iters = 12 * kills + 40
    cfg_whole = tiny_config("whole", **sections(max_iters))
    cfg = tiny_config("killed", **sections(max_iters))
    run_dir = tmp_path / "runs/killed"
    # helios: deterministic embedding gradients (the default float-atomic scatter is not bit-reproducible even
    # without a kill; docs/RELIABILITY.md). The trainer code under test is the same.
    faults = "deterministic" if backend == "helios" else ""
    done = trainer_cli("run", str(cfg_whole), "--backend", backend, entry=ENTRY,
                       env=child_env(RELIABILITY_FAULTS=faults))
    assert done.returncode == 0, done.stderr

    rng = random.Random(seed)
    hits: dict[str, int] = {}
    previous = -1
    for i in range(kills):
        phase = PHASES[i % len(PHASES)]
        env = child_env(RELIABILITY_FAULTS=faults, HELIOS_STEP_DELAY_S="0.02")  # steps at a steadier pace
        if phase.startswith("ckpt"):
            env["HELIOS_CKPT_DELAY_S"] = CKPT_DELAY_S
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, *ENTRY, "run", str(cfg), "--backend", backend], cwd=REPO,
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            in_window = aim(phase, proc, run_dir, rng)
            proc.send_signal(signal.SIGKILL) if proc.poll() is None else None
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert in_window and proc.returncode == -signal.SIGKILL, f"kill {i} ({phase}) missed: {err[-2000:]}"
        now = check_run_dir(run_dir)
        assert now >= previous, f"latest went back from {previous} to {now}"
        previous = now
        # Evidence the kill landed where it was aimed (a temp dir, or a checkpoint newer than `latest`).
        if phase == "ckpt_write":
            assert temps(run_dir), "the mid-write kill left no temp dir to prove it"
        if phase == "ckpt_renamed":
            assert max(s for s, _ in list_checkpoints(run_dir)) > now
        hits[phase] = hits.get(phase, 0) + 1
        print(f"kill {i}: {phase} after {time.monotonic() - t0:.2f} s, latest step {now}")

    resumed = trainer_cli("run", str(cfg), "--backend", backend, entry=ENTRY,
                          env=child_env(RELIABILITY_FAULTS=faults))
    assert resumed.returncode == 0, resumed.stderr
    assert temps(run_dir) == [] and not list(run_dir.glob(".latest.tmp*")), "stale temp files survived"
    check_run_dir(run_dir)
    want, got = final_tensors(tmp_path / "runs/whole"), final_tensors(run_dir)
    assert sorted(want) == sorted(got)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)  # bit for bit
    assert last_losses(run_dir) == last_losses(tmp_path / "runs/whole")
    assert read_events(run_dir)[-1]["status"] == "done"
    return hits


@pytest.mark.slow
def test_sigkill_anywhere_then_resume_is_bitwise_the_uninterrupted_run(tiny_config, tmp_path):
    kills = kill_count("helios")
    hits = kill_loop("helios", tiny_config, tmp_path, kills, seed=kills)
    assert sum(hits.values()) == kills
    if kills >= len(PHASES):
        assert set(hits) == set(PHASES)


@pytest.mark.slow
def test_sigkill_loop_on_the_torch_backend(tiny_config, tmp_path):
    import torch  # noqa: F401  (a pinned test dependency: a missing torch is an error, not a skip)
    kills = kill_count("torch")
    hits = kill_loop("torch", tiny_config, tmp_path, kills, seed=kills + 1)
    assert sum(hits.values()) == kills
