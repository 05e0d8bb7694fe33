"""Ctrl-C (a real SIGINT to a real trainer) in the middle of an in-training eval or sample stops it between
batches or tokens: the trainer checkpoints and exits 130 at once, instead of finishing a long eval first, and
the cut-short eval is neither logged nor counted toward keep_best or early stopping."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from telemetry.events import read_events  # noqa: E402
from tests.conftest import REPO  # noqa: E402
from trainer.checkpoint import latest_path, load_checkpoint  # noqa: E402

# HELIOS_WORK_DELAY_S=0.1 makes the step-4 eval (100 batches) or sample (200 tokens) last 10 s or more.
WORK = {
    "eval": {"eval_interval": 4, "eval_iters": 100, "sample_tokens": 0, "keep_best": True,
             "early_stop_patience": 1},
    "sample": {"eval_interval": 0, "sample_interval": 4, "sample_tokens": 200},
}


@pytest.mark.parametrize("work", ["eval", "sample"])
def test_ctrl_c_during_an_eval_or_sample_stops_it_and_checkpoints(make_config, tmp_path, work):
    cfg = make_config(work, train=dict(WORK[work], max_iters=40, ckpt_interval=0))
    run_dir = tmp_path / "runs" / work
    env = dict(os.environ, HELIOS_WORK_DELAY_S="0.1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "run", str(cfg), "--backend", "torch"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not any(e["event"] == "step" and e["step"] == 4 for e in read_events(run_dir)):
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "step 4 never came"
            time.sleep(0.05)
        time.sleep(0.5)  # well inside the eval or sample
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    assert took < 3.0, f"the trainer took {took:.1f} s to stop: it finished the {work} first"
    events = read_events(run_dir)
    assert [e for e in events if e["event"] in ("eval", "sample")] == []  # cut short: not logged
    assert [(e["step"], e["reason"]) for e in events if e["event"] == "ckpt"] == [(4, "SIGINT")]
    end = events[-1]
    assert end["event"] == "end" and end["status"] == "stopped" and end["step"] == 4
    state = load_checkpoint(latest_path(run_dir)).state
    assert state["best_val_loss"] is None and state["evals_since_best"] == 0  # not counted as an eval
    assert not (run_dir / "ckpt-best").exists()
    assert "resume with:" in out
