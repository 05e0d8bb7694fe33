"""The --nproc launcher's watchdog (train.watchdog_s), with the real mpiexec and a real SIGSTOP: a rank that makes
no progress is named in one line, rank 0 checkpoints when it is not the stalled one, the launcher ends every
process and exits STALLED_EXIT; a SIGTERM while a rank is stalled is acknowledged at once and never ends in 0."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.trainer.test_distributed_signals import TRAIN, _events, _job_tree, _launch, _rank_pids, _reap, _wait_all_gone
from trainer.checkpoint import load_latest
from trainer.distributed import STALLED_EXIT

pytestmark = pytest.mark.usefixtures("needs_mpiexec")


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rank_of(pid: int) -> int:
    environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return int(next(v for v in environ if v.startswith(b"PMI_RANK=")).split(b"=")[1])


@pytest.mark.parametrize("stalled,sigterm", [(1, False), (0, True)])
def test_a_stalled_rank_is_named_and_the_job_ends_with_rank_0s_checkpoint(make_config, tmp_path, stalled, sigterm):
    config = make_config("stall", train={**TRAIN, "watchdog_s": 2})
    run_dir = tmp_path / "runs/stall"
    job = _launch(config)
    tree = []
    try:
        tree = _job_tree(job, run_dir)
        ranks = {_rank_of(pid): pid for pid in _rank_pids(tree)}
        os.kill(ranks[stalled], signal.SIGSTOP)
        stopped = time.monotonic()
        healthy, cpu = ranks[1 - stalled], _cpu_s(ranks[1 - stalled])
        time.sleep(1.0)
        busy = (_cpu_s(healthy) - cpu) / (time.monotonic() - stopped)  # the healthy rank, waiting for its peer
        if sigterm:
            job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=60)
        took = time.monotonic() - stopped
        left = _wait_all_gone(tree, 5)  # before the clean-up below kills whatever is left
    finally:
        _reap(job, tree)
    lines = err.strip().splitlines()
    assert job.returncode == STALLED_EXIT, err[-3000:]
    assert took < 15.0, took
    assert busy < 0.5, f"the waiting rank used {busy:.0%} of a core"
    assert not left, f"processes outlived the launcher: {left}"
    report = [line for line in lines if "made no progress" in line]
    assert len(report) == 1 and report[0].startswith(f"trainer: error: rank {stalled} of 2 made no progress for 2 s")
    if sigterm:
        assert any(line.startswith("trainer: SIGTERM: passed on to the ranks") for line in lines)
    if stalled == 0:
        assert lines[-1].startswith("trainer: no checkpoint was written (rank 0, the one writer, is the stalled rank)")
    else:
        ckpt = _events(run_dir, "ckpt")[-1]
        assert ckpt["reason"] == "rank 1 stalled"
        assert lines[-1] == f"trainer: rank 0 wrote ckpt-{ckpt['step']}; the same command resumes from it"
        assert load_latest(run_dir).step == ckpt["step"] == _events(run_dir, "end")[-1]["step"]
        assert _events(run_dir, "end")[-1]["status"] == "stalled"
    for noise in ("Traceback", "BAD TERMINATION", "[mpiexec@"):
        assert noise not in err, err[-3000:]
