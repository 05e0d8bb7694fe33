"""Dispatch budget of a training step on the alpha-8l shape (issue 8), measured from the runtime counters.

The model is configs/alpha-8l.toml's (384 wide, 8 heads, vocab 4096) with a tiny batch and context so it
runs on lavapipe; per-layer figures are the difference between a 2-layer and a 1-layer model's step.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from trainer.backends.helios import HeliosBackend
from trainer.config import load_config

ROOT = Path(__file__).resolve().parents[2]
B, T = 1, 32


def _step_counters(n_layer: int, steps: int = 3, replay: bool = False):
    """Counters of the last of `steps` steps; recorded lazily unless `replay` (then it is a replayed step).
    Counts, not speed: where the table runs rowwise_unrolled attention, plain rowwise runs instead (the same
    kernels, so the same counts), compiled in a quarter of the time at this head dim (48: ~5 s, not ~19 s)."""
    from helios.kernels.contract import selection

    cfg = load_config(ROOT / "configs" / "alpha-8l.toml")
    model_cfg = dataclasses.replace(cfg.model, n_layer=n_layer)
    head_dim = model_cfg.n_embd // model_cfg.n_head
    with selection.forcing("attention", "rowwise" if selection.choose("attention", (head_dim,)) == "rowwise_unrolled"
                           else None):
        return _counters(model_cfg, cfg, steps, replay)


def _counters(model_cfg, cfg, steps: int, replay: bool):
    backend = HeliosBackend.create(model_cfg, cfg.optim, seed=0)
    backend.set_replay(replay)
    rng = np.random.default_rng(0)
    per_step = []
    for _ in range(steps):
        x = rng.integers(0, model_cfg.vocab_size, size=(B, T), dtype=np.int32)
        y = rng.integers(0, model_cfg.vocab_size, size=(B, T), dtype=np.int32)
        before = backend.counters()
        backend.train_step([(x, y)], lr=1e-3, grad_clip=1.0, spike_threshold=None)
        after = backend.counters()
        per_step.append({k: after[k] - before[k] for k in ("dispatches", "host_waits", "submits")})
    return per_step[-1]


@pytest.fixture(scope="module")
def counted():
    return _step_counters(1), _step_counters(2)


def test_at_most_30_dispatches_per_layer(counted, capsys):
    one, two = counted
    per_layer = two["dispatches"] - one["dispatches"]
    with capsys.disabled():
        print(f"\n[alpha-8l shape, B={B} T={T}] {two['dispatches']} dispatches per step with 2 layers, "
              f"{per_layer} per layer (forward + backward)")
    assert per_layer <= 30, per_layer


def test_optimizer_and_clipping_take_at_most_5_dispatches():
    from autograd.nn import GPT, GPTConfig
    from autograd.optim import AdamW
    from helios import runtime as rt

    model = GPT(GPTConfig(n_layer=1, n_embd=384, n_head=8, n_kv_head=8, block_size=512, vocab_size=4096))
    opt = AdamW(model.arena, lr=1e-3, grad_clip=1.0)
    opt.step()
    rt.sync()
    before = rt.counters()["dispatches"]
    opt.step()
    assert rt.counters()["dispatches"] - before <= 5


def test_exactly_one_host_wait_per_step(counted):
    for c in counted:
        assert c["host_waits"] == 1, c


def test_a_replayed_step_records_nothing_submits_once_and_waits_once():
    c = _step_counters(2, replay=True)
    assert c == {"dispatches": 0, "host_waits": 1, "submits": 1}, c


def test_in_the_gpu_profile_a_replayed_step_also_submits_once_and_waits_once(tmp_path):
    """Staging memory, as on a card with memory of its own: the step's scalars come back in one host-visible
    buffer the captured step fills, so the read is the step's only submit and wait (no staging copies)."""
    import json
    import os
    import subprocess
    import sys

    code = ("import json, sys; sys.path.insert(0, 'tests/trainer'); import test_dispatch_budget as t; "
            "from helios import runtime as rt; assert not rt.get_runtime().zero_copy; "
            "print(json.dumps(t._step_counters(1, replay=True)))")
    env = {**os.environ, "HELIOS_PROFILE": "gpu", "HELIOS_COOPMAT": "off"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    c = json.loads(out.stdout.strip().splitlines()[-1])
    assert c == {"dispatches": 0, "host_waits": 1, "submits": 1}, c
