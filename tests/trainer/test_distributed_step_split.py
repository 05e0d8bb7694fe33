"""Under data parallelism the step events' time split covers the step: fwd + bwd + opt + wait + comm_ms (the
gradient reduce, which waits for the device's forward and backward) is at least 90% of step_ms (issue 38 item 16:
without comm_ms a 2-rank step was ~8% accounted for)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.trainer.test_distributed_signals import REPO

pytestmark = pytest.mark.usefixtures("needs_mpiexec")


def test_the_step_split_sums_to_the_step_on_two_ranks(make_config, tmp_path):
    config = make_config("split", train={"max_iters": 8, "eval_interval": 0, "ckpt_interval": 0, "sample_tokens": 0})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HELIOS_INJECT", "PMI_"))}
    done = subprocess.run([sys.executable, "-m", "trainer", "run", str(config), "--nproc", "2"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (tmp_path / "runs/split/metrics.jsonl").read_text().splitlines()
    steps = [e for e in map(json.loads, lines) if e["event"] == "step"]
    assert len(steps) == 8
    for e in steps[2:]:  # past the compile and capture steps
        parts = e["fwd_ms"] + e["bwd_ms"] + e["opt_ms"] + e["wait_ms"] + e["comm_ms"]
        assert e["comm_ms"] >= e["allreduce_ms"]
        assert parts >= 0.9 * e["step_ms"], e
