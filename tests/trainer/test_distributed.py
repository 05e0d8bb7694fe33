"""Data parallelism over MPI on lavapipe (the ranks share the one CPU device): 2 ranks at batch B train like
1 rank at batch 2B (gpt2 and llama, helios and the torch reference), a 2-rank resume is bit-exact, a
resume on another rank count keeps the global batch and its order, and a killed rank ends the whole job with
`latest` intact. (Signals to the launcher: test_distributed_signals.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from trainer.checkpoint import load_latest

REPO = Path(__file__).resolve().parents[2]
LLAMA = {"arch": "llama", "n_kv_head": 1, "bias": False, "tie_embeddings": False}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HELIOS_STEP_DELAY", "HELIOS_INJECT", "PMI_"))}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def _run(config: Path, *args: str, nproc: int | None = None, timeout: float = 240, **env: str):
    cmd = [sys.executable, "-m", "trainer", "run", str(config), *args]
    if nproc:
        cmd += ["--nproc", str(nproc)]
    return subprocess.run(cmd, cwd=REPO, env=_env(**env), capture_output=True, text=True, timeout=timeout)


def _losses(run_dir: Path) -> dict[int, float]:
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "step":
            out[event["step"]] = event["loss"]
    return out


def _params(run_dir: Path) -> dict[str, np.ndarray]:
    return {k: v for k, v in load_latest(run_dir).tensors.items() if k.startswith("param.")}


pytestmark = pytest.mark.usefixtures("needs_mpiexec")


@pytest.mark.parametrize("backend,arch", [("helios", "gpt2"), ("helios", "llama"), ("torch", "llama")])
def test_two_ranks_at_batch_b_train_like_one_rank_at_2b(make_config, tmp_path, backend, arch):
    model = LLAMA if arch == "llama" else {}
    train = {"max_iters": 20, "eval_interval": 10, "ckpt_interval": 10, "sample_tokens": 0}
    one = make_config("one", model=model, train={**train, "batch_size": 8})
    two = make_config("two", model=model, train={**train, "batch_size": 4})
    done1 = _run(one, "--backend", backend)
    done2 = _run(two, "--backend", backend, nproc=2)
    assert done1.returncode == 0, done1.stderr
    assert done2.returncode == 0, done2.stderr
    runs = tmp_path / "runs"
    l1, l2 = _losses(runs / "one"), _losses(runs / "two")
    assert sorted(l1) == sorted(l2) == list(range(1, 21))
    for step in l1:
        assert abs(l2[step] - l1[step]) <= 1e-5 * abs(l1[step]), (step, l1[step], l2[step])
    # All parameters as one vector, relative to its norm. (Per tensor, the key part of c_attn.bias would
    # fail any relative bound: its exact gradient is zero, softmax being blind to a per-key constant, so it
    # moves only by Adam-normalised rounding noise, which differs with the reduction order.)
    p1, p2 = _params(runs / "one"), _params(runs / "two")
    flat1 = np.concatenate([p1[k].ravel() for k in sorted(p1)])
    flat2 = np.concatenate([p2[k].ravel() for k in sorted(p1)])
    assert np.linalg.norm(flat2 - flat1) <= 1e-5 * np.linalg.norm(flat1)
    assert np.abs(flat2 - flat1).max() <= 1e-4
    events = [json.loads(x) for x in (runs / "two" / "metrics.jsonl").read_text().splitlines()]
    step = next(e for e in events if e["event"] == "step")
    assert step["world_size"] == 2 and step["allreduce_ms"] >= 0
    assert done2.stdout.count("run directory:") == 1  # rank 0 alone prints and writes


def test_resume_is_bit_exact_on_two_ranks_and_re_shards_over_another_rank_count(make_config, tmp_path):
    train = {"batch_size": 4, "max_iters": 12, "eval_interval": 6, "ckpt_interval": 6, "sample_tokens": 0}
    schedule = {"lr_decay_iters": 12}  # the schedule must not depend on where each part stops
    whole, same, mixed = (make_config(name, train=train, schedule=schedule) for name in ("whole", "same", "mixed"))
    assert _run(whole, nproc=2).returncode == 0
    # 2 ranks -> 2 ranks: the same arithmetic, so the same bits.
    for part in (_run(same, "--train.max_iters=6", nproc=2), _run(same, nproc=2)):
        assert part.returncode == 0, part.stderr
    # 2 -> 1 -> 2 with the config's batch_size 4 each time: the global batch of 8 and its order are kept.
    parts = [_run(mixed, "--train.max_iters=4", nproc=2), _run(mixed, "--train.max_iters=8"), _run(mixed, nproc=2)]
    for part in parts:
        assert part.returncode == 0, part.stderr
    assert ("resuming ckpt-4 (2 ranks x batch_size 4) on 1 rank: the same global batch of 8 rows in the same "
            "order, 8 per rank") in parts[1].stderr
    assert "on 2 ranks: the same global batch of 8 rows in the same order, 4 per rank" in parts[2].stderr
    assert "warning" not in parts[1].stderr + parts[2].stderr
    runs = tmp_path / "runs"
    lw, ls, lm = _losses(runs / "whole"), _losses(runs / "same"), _losses(runs / "mixed")
    assert sorted(lw) == sorted(ls) == sorted(lm) == list(range(1, 13))
    assert [ls[s] for s in range(1, 13)] == [lw[s] for s in range(1, 13)]
    pw, ps = _params(runs / "whole"), _params(runs / "same")
    assert all(np.array_equal(pw[k], ps[k]) for k in pw)
    assert [lm[s] for s in range(1, 5)] == [lw[s] for s in range(1, 5)]  # before the first switch: bit-exact
    for step in range(5, 13):  # one rank sums the batch in another order: within rounding
        assert abs(lm[step] - lw[step]) <= 1e-5 * abs(lw[step]), (step, lw[step], lm[step])
    pm = _params(runs / "mixed")
    flat_w = np.concatenate([pw[k].ravel() for k in sorted(pw)])
    flat_m = np.concatenate([pm[k].ravel() for k in sorted(pw)])
    assert np.linalg.norm(flat_m - flat_w) <= 1e-5 * np.linalg.norm(flat_w)
    events = map(json.loads, (runs / "mixed" / "metrics.jsonl").read_text().splitlines())
    sizes = [e.get("world_size", 1) for e in events if e["event"] == "step"]
    assert sizes == [2] * 4 + [1] * 4 + [2] * 4


def test_a_killed_rank_ends_the_job_with_latest_complete(make_config, tmp_path):
    config = make_config("killed", train={"batch_size": 4, "max_iters": 400, "ckpt_interval": 2,
                                          "eval_interval": 0, "sample_tokens": 0})
    cmd = [sys.executable, "-m", "trainer", "run", str(config), "--nproc", "2"]
    job = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=_env(HELIOS_STEP_DELAY_S="0.05"))
    run_dir = tmp_path / "runs" / "killed"
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "latest").exists() and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.2)  # (stdout is small: a progress line every few steps, read at the end)
        assert (run_dir / "latest").exists(), "no checkpoint appeared"
        victims = []
        while not victims and time.monotonic() < deadline:
            victims = [int(p) for p in _children_with_rank(job.pid, 1)]
            time.sleep(0.1)
        assert victims, "rank 1 not found"
        os.kill(victims[0], signal.SIGKILL)
        t0 = time.monotonic()
        _, err = job.communicate(timeout=60)
        assert time.monotonic() - t0 < 60
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert job.returncode != 0
    assert "a rank died or was killed" in err
    ckpt = load_latest(run_dir)  # a complete, verified checkpoint
    assert ckpt is not None and ckpt.step >= 2


def _children_with_rank(root: int, rank: int) -> list[int]:
    """Descendants of `root` (the launcher) that are MPI rank `rank`."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found = []
    for pid in parents:
        p, hops = pid, 0
        while p in parents and p != root and hops < 10:
            p, hops = parents[p], hops + 1
        if p != root or pid == root:
            continue
        try:
            environ = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"PMI_RANK={rank}".encode() in environ:
            found.append(pid)
    return found


def test_nproc_must_be_positive(make_config):
    done = _run(make_config("bad"), "--nproc", "0", timeout=60)
    assert done.returncode == 2
    assert "--nproc must be at least 1" in done.stderr


def test_each_rank_draws_its_own_dropout_masks():
    from trainer.backends.helios import HeliosBackend
    from trainer.distributed import World

    backend = HeliosBackend.__new__(HeliosBackend)
    backend.forwards = 7
    backend.set_world(None)
    assert backend._dropout_index() == 7  # one process: the pass count, as before data parallelism
    indices = set()
    for rank in range(2):
        backend.set_world(World(rank=rank, size=2))
        indices.add(backend._dropout_index())
    assert indices == {14, 15}
