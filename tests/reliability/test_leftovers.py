"""What a killed or rolled-back run leaves behind is handled on the next start: temp files are removed, a
checkpoint `latest` does not name is replaced rather than trusted, a half-written log line does not swallow the
next event, and a damaged token cache is rebuilt."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest

from telemetry.events import MetricsWriter, read_events
from trainer.checkpoint import latest_path, load_checkpoint
from trainer.cli import main


def run(cfg, capsys, *extra: str) -> int:
    code = main(["run", str(cfg), "--backend", "helios", *extra])
    capsys.readouterr()
    return code


def test_stale_temps_are_removed_at_start(tiny_config, tmp_path, capsys):
    cfg = tiny_config()
    run_dir = tmp_path / "runs/tiny"
    run_dir.mkdir(parents=True)
    junk = [run_dir / ".ckpt-4.tmp999999", run_dir / ".ckpt-2.old999999"]
    for d in junk:
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"half")
    (run_dir / ".latest.tmp999999").write_text("ckpt-")
    (run_dir / ".write-probe-abc").write_text("")
    assert run(cfg, capsys) == 0
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".")) == [".lock"]


def test_a_checkpoint_latest_does_not_name_is_replaced(tiny_config, tmp_path, capsys):
    # Roll a finished run back by pointing `latest` at ckpt-4, then train on with another learning rate: the new
    # ckpt-8 must hold the new trajectory, not the old ckpt-8 that was lying there.
    cfg = tiny_config(train={"keep_ckpts": 5})
    run_dir = tmp_path / "runs/tiny"
    assert run(cfg, capsys) == 0
    old = load_checkpoint(run_dir / "ckpt-8").tensors["param.wte.weight"]
    (run_dir / "latest").write_text("ckpt-4\n")
    assert run(cfg, capsys, "--optim.lr=0.01") == 0
    assert latest_path(run_dir).name == "ckpt-8"
    new = load_checkpoint(run_dir / "ckpt-8").tensors["param.wte.weight"]
    assert not np.array_equal(old, new)
    assert not [p for p in run_dir.iterdir() if ".old" in p.name or ".tmp" in p.name]


def test_a_half_written_log_line_does_not_swallow_the_next_event(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"event": "step", "t": 1.0, "step": 1}) + "\n" + '{"event": "step", "t": 2.0, "st')
    with MetricsWriter(path) as writer:
        writer.emit("config", t=3.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        events = read_events(path)
    assert [e["event"] for e in events] == ["step", "config"] and len(caught) == 1


def test_a_damaged_token_cache_is_rebuilt(tiny_config, tmp_path, corpus, capsys):
    # A copy of the corpus: its token cache folder is this test's alone (other tests' configs add caches beside the
    # shared corpus, and a glob over those could pick one this run never used).
    own = tmp_path / "verse.txt"
    own.write_bytes(corpus.read_bytes())
    cfg = tiny_config(data={"path": str(own)}, train={"max_iters": 2})
    assert run(cfg, capsys) == 0
    (cache,) = (own.parent / f"{own.name}.helios").glob("bpe-257-*")
    train_bin = cache / "train.bin"
    good = train_bin.read_bytes()
    train_bin.write_bytes(good[: len(good) // 2])  # as if a copy or a disk had cut it short
    assert run(tiny_config("again", data={"path": str(own)}, train={"max_iters": 2}), capsys) == 0
    assert train_bin.read_bytes() == good


@pytest.mark.parametrize("model", [{}, {"arch": "llama", "n_head": 4, "n_kv_head": 2, "bias": False,
                                        "tie_embeddings": False}])
def test_count_params_matches_the_helios_model(model):
    from tests.reliability.conftest import TINY
    from trainer.backend import count_params, create_backend, param_shapes
    from trainer.config import load_config_text

    text = "[model]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in {**TINY["model"], **model}.items())
    cfg = load_config_text(text)  # json.dumps writes these values as valid TOML
    backend = create_backend("helios", cfg.model, cfg.optim, seed=0)
    shapes = {k[len("param."):]: v.shape for k, v in backend.state_dict().items() if k.startswith("param.")}
    assert shapes == param_shapes(cfg.model) and backend.num_params() == count_params(cfg.model)


def test_summary_counts_the_surviving_trajectory_once(tiny_config, tmp_path, capsys, monkeypatch):
    # Stopped after step 6 with its last checkpoint at 4 (as a kill leaves it): the resume replays 5 and 6.
    from telemetry.__main__ import main as telemetry_main

    monkeypatch.setenv("HELIOS_INJECT_NAN_STEPS", "5")
    cfg = tiny_config(train={"max_iters": 6, "ckpt_interval": 4})
    assert run(cfg, capsys) == 0
    run_dir = tmp_path / "runs/tiny"
    (run_dir / "latest").write_text("ckpt-4\n")
    assert run(cfg, capsys) == 0
    assert telemetry_main(["summary", str(run_dir), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["step"] == 6 and summary["skips"] == {"nan": 1} and summary["resumes"] == 1


def test_a_memory_budget_below_what_the_pool_reserves_is_said_once(tiny_config, tmp_path):
    from tests.reliability.conftest import child_env, trainer_cli

    # 2 layers x 512 wide: ~6.5M parameters, ~100 MiB of weights, gradients and AdamW moments: past a 64 MiB
    # budget (one lavapipe block), which the soft budget then lets the pool grow beyond.
    cfg = tiny_config(model={"n_layer": 2, "n_embd": 512, "n_head": 8}, train={"max_iters": 3, "ckpt_interval": 0})
    proc = trainer_cli("run", str(cfg), env=child_env(HELIOS_MEMORY_BUDGET_MB="64"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    notes = [line for line in proc.stdout.splitlines() if "HELIOS_MEMORY_BUDGET_MB=64" in line]
    assert len(notes) == 1, proc.stdout
    need = int(notes[0].split("reserves ")[1].split(" MiB")[0])
    assert need > 64 and f"this run needs at least {need} MiB" in notes[0] and "the budget is soft" in notes[0]
    steps = [json.loads(line) for line in (tmp_path / "runs/tiny/metrics.jsonl").read_text().splitlines()]
    assert max(e["pool_bytes"] for e in steps if e["event"] == "step") >= need << 20 > 64 << 20


def test_nproc_past_the_cpu_cores_warns(tiny_config, tmp_path, capsys, monkeypatch):
    """The launcher warns once, before any rank starts, when --nproc exceeds the cores it may run on. (That an
    oversubscribed 2-rank job still trains is tests/trainer/test_distributed.py's; here the job is not started.)"""
    from trainer import distributed

    started = []

    def relaunch(nproc, argv, check=None):
        check()
        started.append((nproc, list(argv)))
        return 0

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(distributed, "relaunch", relaunch)
    cfg = tiny_config(train={"max_iters": 2, "ckpt_interval": 0})
    assert main(["run", str(cfg), "--nproc", "2"]) == 0
    err = capsys.readouterr().err
    assert started == [(2, ["run", str(cfg)])]
    assert err.startswith("trainer: warning: --nproc 2 starts more ranks than this machine has CPU cores (1)")
    assert "--nproc 1 or less" in err and err.count("warning: --nproc") == 1
    capsys.readouterr()
    assert main(["run", str(cfg), "--nproc", "1"]) == 0 and "warning" not in capsys.readouterr().err
