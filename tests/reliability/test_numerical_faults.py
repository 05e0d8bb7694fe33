"""Numerical faults on the helios backend: a NaN/Inf loss or gradient skips the step (parameters, Adam moments
and step count untouched), is logged as a `skip` event, and training goes on; nan_policy = "stop" checkpoints
the last good state and exits 3; a gradient-norm spike above spike_threshold skips the optimizer.
(The same contract on the torch backend: tests/trainer/test_resume.py and test_torch_backend.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest

from telemetry.events import read_events
from tests.reliability.conftest import TINY
from trainer.checkpoint import latest_path, load_checkpoint
from trainer.cli import main
from trainer.config import load_config_text

EVERY_STEP = {"train": {"max_iters": 6, "ckpt_interval": 1, "keep_ckpts": 10}}


def run(cfg, capsys, *extra: str) -> int:
    code = main(["run", str(cfg), "--backend", "helios", *extra])
    capsys.readouterr()
    return code


def tensors(run_dir, step: int) -> dict[str, np.ndarray]:
    return load_checkpoint(run_dir / f"ckpt-{step}").tensors


def assert_same_state(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    """Parameters, Adam moments and adam_step equal bit for bit (rng_forwards counts forward passes, skipped
    ones included: it only seeds dropout masks)."""
    assert sorted(a) == sorted(b)
    for key in a.keys() - {"rng_forwards"}:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_injected_nan_skips_the_step_and_leaves_adam_untouched(tiny_config, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HELIOS_INJECT_NAN_STEPS", "3,5")
    assert run(tiny_config(**EVERY_STEP), capsys) == 0
    run_dir = tmp_path / "runs/tiny"
    events = read_events(run_dir)
    assert [(e["step"], e["reason"], e["policy"]) for e in events if e["event"] == "skip"] == [(3, "nan", "skip"),
                                                                                          (5, "nan", "skip")]
    steps = {e["step"]: e for e in events if e["event"] == "step"}
    assert sorted(steps) == [1, 2, 3, 4, 5, 6] and events[-1]["status"] == "done"
    assert steps[3]["skipped"] == "nan" and steps[3]["grad_norm"] is None and steps[4]["skipped"] is None
    assert_same_state(tensors(run_dir, 2), tensors(run_dir, 3))  # parameters, m, v, adam_step: all untouched
    assert_same_state(tensors(run_dir, 4), tensors(run_dir, 5))
    assert int(tensors(run_dir, 6)["adam_step"]) == 4
    assert not np.array_equal(tensors(run_dir, 3)["param.wte.weight"], tensors(run_dir, 4)["param.wte.weight"])


def test_nan_policy_stop_checkpoints_the_last_good_state_and_exits_3(tiny_config, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HELIOS_INJECT_NAN_STEPS", "3")
    cfg = tiny_config(train={**EVERY_STEP["train"], "nan_policy": "stop"})
    assert main(["run", str(cfg), "--backend", "helios"]) == 3
    err = capsys.readouterr().err
    assert "NaN/Inf at step 3" in err and 'nan_policy = "stop"' in err and "Traceback" not in err
    run_dir = tmp_path / "runs/tiny"
    assert latest_path(run_dir).name == "ckpt-3"
    assert_same_state(tensors(run_dir, 2), tensors(run_dir, 3))
    events = read_events(run_dir)
    assert [e["reason"] for e in events if e["event"] == "ckpt"][-1] == "nan"
    assert events[-1]["event"] == "end" and events[-1]["status"] == "diverged"
    assert [e["policy"] for e in events if e["event"] == "skip"] == ["stop"]


def test_spike_threshold_skips_the_optimizer(tiny_config, tmp_path, capsys):
    # A threshold below every gradient norm: no step may change anything.
    assert run(tiny_config(**EVERY_STEP), capsys, "--train.spike_threshold=1e-6") == 0
    run_dir = tmp_path / "runs/tiny"
    events = read_events(run_dir)
    skips = [e for e in events if e["event"] == "skip"]
    assert [e["reason"] for e in skips] == ["spike"] * 6 and all(e["grad_norm"] > 1e-6 for e in skips)
    assert_same_state(tensors(run_dir, 1), tensors(run_dir, 6))
    assert int(tensors(run_dir, 6)["adam_step"]) == 0


def _backend():
    from trainer.backend import create_backend

    m = TINY["model"]
    cfg = load_config_text("[model]\n" + "\n".join(f"{k} = {v}" for k, v in m.items()))
    return create_backend("helios", cfg.model, cfg.optim, seed=5)


def _batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 257, size=(2, 9)).astype(np.int32)
    return w[:, :-1], w[:, 1:]


@pytest.mark.parametrize("poison", [math.nan, math.inf])
def test_a_real_nonfinite_loss_and_gradient_skip_on_the_device(poison):
    # No test hook: a NaN/Inf weight makes the loss and every gradient non-finite on the device itself.
    be = _backend()
    be.train_step([_batch(0)], lr=1e-2, grad_clip=1.0, spike_threshold=None)  # real Adam state to protect
    state = be.state_dict()
    state["param.ln_f.weight"] = state["param.ln_f.weight"].copy()
    state["param.ln_f.weight"][3] = poison
    be.load_state_dict(state)
    res = be.train_step([_batch(1)], lr=1e-2, grad_clip=1.0, spike_threshold=None)
    assert res.skipped == "nan" and not math.isfinite(res.loss)
    assert_same_state(state, be.state_dict())
    state["param.ln_f.weight"][3] = 1.0  # repaired: training goes on
    be.load_state_dict(state)
    res = be.train_step([_batch(2)], lr=1e-2, grad_clip=1.0, spike_threshold=None)
    assert res.skipped is None and math.isfinite(res.loss) and int(be.state_dict()["adam_step"]) == 2
