"""helios.bench profile: a training step's per-family breakdown accounts for every dispatch the step launches."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import helios.runtime as rt
from helios.errors import HeliosError

ROOT = Path(__file__).resolve().parents[1]
TINY = {"n_layer": 2, "n_embd": 32, "block_size": 16, "vocab_size": 512, "batch_size": 2}


@pytest.fixture
def tiny_config(tmp_path) -> Path:
    """configs/shakespeare.toml at 2 layers, n_embd 32, block 16, vocab 512, batch 2."""
    text = (ROOT / "configs" / "shakespeare.toml").read_text()
    for key, value in TINY.items():
        text, n = re.subn(rf"(?m)^{key} = \d+$", f"{key} = {value}", text)
        assert n == 1, key
    path = tmp_path / "tiny.toml"
    path.write_text(text)
    return path


def test_the_breakdown_accounts_for_every_dispatch_of_the_step(tiny_config):
    from helios.bench.profile import profile_step
    from helios.bench.tuner import config_step
    from trainer.config import load_config

    step, reset, backend = config_step(load_config(tiny_config))
    backend.set_replay(False)
    try:
        rows, totals = profile_step(step, steps=2, warmup=1)
    finally:
        reset()
    names = [r["name"] for r in rows]
    assert len(names) == len(set(names))
    for fam in ("matmul", "attention forward", "attention backward", "rows (layernorm)", "cross_entropy",
                "embedding", "adamw", "grad_norm"):
        assert fam in names, (fam, names)
    # every dispatch the runtime counted was timed, and grouped once
    assert totals["profiled_dispatches"] == totals["dispatches"] > 0
    assert sum(r["dispatches"] for r in rows) == totals["dispatches"]
    assert all(r["ms"] > 0 for r in rows)
    assert sum(r["ms"] for r in rows) == pytest.approx(totals["device_ms"])
    assert totals["device_ms"] <= totals["profiled_ms"]  # device time of the dispatches within the steps' wall
    assert [r["ms"] for r in rows] == sorted((r["ms"] for r in rows), reverse=True)
    assert rt.get_runtime().profiler is None  # the hook is gone after the block


def test_json_gives_one_record_per_family(tiny_config, capsys):
    from helios.bench.__main__ import main

    assert main(["profile", str(tiny_config), "--steps", "1", "--warmup", "1", "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    names = [r["name"] for r in records]
    assert "matmul" in names and len(names) == len(set(names))
    assert sum(r["dispatches"] for r in records) == records[0]["step_dispatches"]
    assert sum(r["ms"] for r in records) <= records[0]["step_profiled_ms"]


def test_profiling_refuses_a_capture_scope(tiny_config):
    from helios.bench.tuner import config_step
    from trainer.config import load_config

    step, reset, backend = config_step(load_config(tiny_config))
    try:
        with pytest.raises(HeliosError, match="capture scope"), rt.profiling():
            for _ in range(3):  # lazy, then the capture
                step()
    finally:
        reset()
    assert rt.get_runtime().profiler is None
