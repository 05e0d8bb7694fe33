"""A run that clips its gradient on most steps after warmup gets one warning, on the console as it trains and in
`telemetry summary`, naming the rate and the usual causes; a run that never clips gets none."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch  # noqa: F401  (a pinned test dependency: a missing torch is an error, not a skip)

from telemetry.summary import clip_warning
from tests.conftest import REPO

CAUSES = "a learning rate too high for the batch, or a batch too small: try a lower optim.lr or a larger " \
         "train.batch_size"


def _trainer_and_summary(config, run_dir) -> tuple[str, str]:
    run = subprocess.run([sys.executable, "-m", "trainer", "run", str(config), "--backend", "torch"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = subprocess.run([sys.executable, "-m", "telemetry", "summary", str(run_dir)], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    assert summary.returncode == 0, summary.stderr[-2000:]
    return run.stdout, summary.stdout


@pytest.mark.parametrize("grad_clip,warned", [(1e-6, True), (0.0, False)])
def test_a_run_that_clips_most_steps_is_warned_once_on_the_console_and_in_the_summary(make_config, tmp_path,
                                                                                    grad_clip, warned):
    # TINY: 8 steps, 2 of warmup; a grad_clip of 1e-6 clips every step, 0 turns clipping off.
    config = make_config("clip", optim={"grad_clip": grad_clip}, train={"sample_tokens": 0})
    console, summary = _trainer_and_summary(config, tmp_path / "runs/clip")
    for out in (console, summary):
        if warned:
            assert out.count("steps after warmup") == 1, out
            assert "warning: 6 of 6 steps after warmup (100%) clipped their gradient norm" in out
            assert CAUSES in out
        else:
            assert "after warmup" not in out, out


def test_the_clip_warning_starts_past_a_fifth_of_the_steps():
    assert clip_warning(20, 100) is None and clip_warning(0, 0) is None
    assert "21 of 100 steps after warmup (21%)" in clip_warning(21, 100)
