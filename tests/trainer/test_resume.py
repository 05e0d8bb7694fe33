"""Resuming reproduces the uninterrupted run bit for bit; NaN policy; step telemetry; sample/eval commands."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch  # noqa: F401  (a pinned test dependency: a missing torch is an error, not a skip)

from telemetry.events import read_events
from trainer.checkpoint import latest_path, load_checkpoint
from trainer.cli import main

STEP_FIELDS = {"event", "t", "step", "loss", "lr", "grad_norm", "clip_coef", "skipped", "tok_per_s", "step_ms",
               "fwd_ms", "bwd_ms", "opt_ms", "wait_ms", "dispatches", "submits", "barriers", "pool_bytes",
               "pool_regions", "pool_classes", "device_allocs", "mfu"}


def losses(run_dir, kind="step", key="loss"):
    return [(e["step"], e[key]) for e in read_events(run_dir) if e["event"] == kind]


@pytest.mark.parametrize("extra", [{}, {"model": {"dropout": 0.1, "arch": "llama", "n_kv_head": 1},
                                        "train": {"grad_accum": 2}}])
def test_resume_reproduces_uninterrupted_losses_bitwise(make_config, tmp_path, capsys, extra):
    # lr_decay_iters pinned: the schedule must not depend on where the first run happened to stop.
    sections = {"schedule": {"warmup_iters": 2, "lr_decay_iters": 10}, **extra}
    sections["train"] = {"max_iters": 10, "ckpt_interval": 0, **extra.get("train", {})}
    whole = make_config("whole", **sections)
    split = make_config("split", **sections)
    assert main(["run", str(whole), "--backend", "torch"]) == 0
    assert main(["run", str(split), "--backend", "torch", "--train.max_iters=6"]) == 0
    assert main(["run", str(split), "--backend", "torch"]) == 0
    out = capsys.readouterr().out
    assert "resumed from ckpt-6" in out
    a, b = losses(tmp_path / "runs/whole"), losses(tmp_path / "runs/split")
    assert [s for s, _ in a] == list(range(1, 11)) and a == b  # exact float equality
    assert losses(tmp_path / "runs/whole", "eval", "val_loss")[-1] == losses(tmp_path / "runs/split", "eval",
                                                                              "val_loss")[-1]
    ckpt_a = load_checkpoint(latest_path(tmp_path / "runs/whole"))
    ckpt_b = load_checkpoint(latest_path(tmp_path / "runs/split"))
    assert ckpt_a.step == ckpt_b.step == 10
    for k, v in ckpt_a.tensors.items():
        np.testing.assert_array_equal(v, ckpt_b.tensors[k], err_msg=k)


def test_every_step_event_has_the_fields_and_run_dir_has_its_files(make_config, tmp_path):
    assert main(["run", str(make_config()), "--backend", "torch"]) == 0
    run = tmp_path / "runs/tiny"
    events = read_events(run)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "config" and kinds[-1] == "end" and {"eval", "sample", "ckpt"} <= set(kinds)
    steps = [e for e in events if e["event"] == "step"]
    assert len(steps) == 8
    for e in steps:
        assert STEP_FIELDS <= set(e), STEP_FIELDS - set(e)
        assert e["mfu"] is None and e["skipped"] is None and e["tok_per_s"] > 0
    assert all("event" in e and "t" in e for e in events)
    resolved = json.loads((run / "resolved.json").read_text())
    assert resolved["backend"] == "torch" and resolved["config"]["model"]["n_kv_head"] == 2
    assert sorted(p.name for p in run.glob("ckpt-*")) == ["ckpt-4", "ckpt-8"]
    assert (run / "latest").read_text().strip() == "ckpt-8"


def test_keep_ckpts_prunes_old_checkpoints(make_config, tmp_path):
    cfg = make_config(train={"max_iters": 10, "ckpt_interval": 2, "keep_ckpts": 2, "eval_interval": 0})
    assert main(["run", str(cfg), "--backend", "torch"]) == 0
    assert sorted(p.name for p in (tmp_path / "runs/tiny").glob("ckpt-*")) == ["ckpt-10", "ckpt-8"]


def test_nan_injection_skips_the_step_and_logs_it(make_config, tmp_path, monkeypatch):
    monkeypatch.setenv("HELIOS_INJECT_NAN_STEPS", "3,5")
    assert main(["run", str(make_config()), "--backend", "torch"]) == 0
    events = read_events(tmp_path / "runs/tiny")
    skips = [e for e in events if e["event"] == "skip"]
    assert [(e["step"], e["reason"]) for e in skips] == [(3, "nan"), (5, "nan")]
    steps = {e["step"]: e for e in events if e["event"] == "step"}
    assert steps[3]["skipped"] == "nan" and steps[3]["loss"] is None and steps[4]["skipped"] is None
    ckpt = load_checkpoint(latest_path(tmp_path / "runs/tiny"))
    assert int(ckpt.tensors["adam_step"]) == 8 - 2  # the skipped steps never reached AdamW


def test_nan_policy_stop_checkpoints_and_exits_3(make_config, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HELIOS_INJECT_NAN_STEPS", "3")
    cfg = make_config(train={"nan_policy": "stop"})
    assert main(["run", str(cfg), "--backend", "torch"]) == 3
    assert "NaN" in capsys.readouterr().err
    run = tmp_path / "runs/tiny"
    ckpt = load_checkpoint(latest_path(run))
    assert ckpt.step == 3 and int(ckpt.tensors["adam_step"]) == 2
    assert read_events(run)[-1]["status"] == "diverged"


def test_sample_and_eval_commands(make_config, tmp_path, capsys):
    assert main(["run", str(make_config()), "--backend", "torch"]) == 0
    capsys.readouterr()
    run = str(tmp_path / "runs/tiny")
    assert main(["sample", "--run", run, "--prompt", "The king", "--tokens", "12", "--seed", "3"]) == 0
    first = capsys.readouterr().out
    assert first.startswith("The king") and len(first) > len("The king")
    assert main(["sample", "--run", run, "--prompt", "The king", "--tokens", "12", "--seed", "3"]) == 0
    assert capsys.readouterr().out == first
    assert main(["eval", "--run", run, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["step"] == 8 and result["val_loss"] == losses(run, "eval", "val_loss")[-1][1]
    assert main(["sample", "--run", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_schedule_changes_on_resume_warn_each_and_give_the_new_learning_rate(make_config, tmp_path):
    from tests.conftest import run_python

    config = make_config("sched", schedule={"warmup_iters": 2, "lr_decay_iters": 8}, train={"ckpt_interval": 0})
    run = ("-m", "trainer", "run", str(config), "--backend", "torch")
    assert run_python(*run, "--train.max_iters=6").returncode == 0
    # (A longer run with the schedule pinned says nothing: test_distributed's 2 -> 1 -> 2 resume checks that.)
    # lr_decay_iters=none: it follows max_iters again, as in a config that never set it.
    changed = run_python(*run, "--train.max_iters=10", "--schedule.decay=linear", "--schedule.min_lr=0.0003",
                         "--schedule.lr_decay_iters=none")
    assert changed.returncode == 0, changed.stderr
    assert changed.stderr.strip().splitlines() == [
        "trainer: warning: resuming ckpt-6 with [schedule] decay = linear (it was trained with cosine)",
        "trainer: warning: resuming ckpt-6 with [schedule] lr_decay_iters = 10 (it was trained with 8); "
        "lr_decay_iters follows max_iters unless set, so extending a run stretches its decay: pass "
        "--schedule.lr_decay_iters=8 to keep the schedule it was trained with",
        "trainer: warning: resuming ckpt-6 with [schedule] min_lr = 0.0003 (it was trained with 0.0)",
        # cosine from 3e-3 to 0 over steps 2..8 gives 7.5e-4 at step 6; linear to 3e-4 over 2..10 gives 1.65e-3
        "trainer: note: the learning rate at step 6 is 0.00165 (the checkpoint's settings give 0.00075)",
    ]
    lrs = dict(losses(tmp_path / "runs/sched", key="lr"))
    assert lrs[7] == pytest.approx(1.65e-3)  # step 7 trains at the new schedule's rate for iteration 6
