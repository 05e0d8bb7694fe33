"""Two helios training runs from the same seed and batches end bit-identical (no float atomics in the
step: the embedding scatter is the host-planned sorted one), which is what makes resume bit-exact."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from trainer.backends.helios import HeliosBackend
from trainer.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def _train(steps: int = 5) -> bytes:
    cfg = load_config(ROOT / "configs" / "shakespeare.toml")
    model = dataclasses.replace(cfg.model, n_layer=1, n_embd=32, n_head=2, n_kv_head=2, block_size=16,
                                vocab_size=64)
    backend = HeliosBackend.create(model, cfg.optim, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        x = rng.integers(0, 8, (4, 16), dtype=np.int32)  # few distinct ids: many repeats per embedding row
        y = rng.integers(0, 8, (4, 16), dtype=np.int32)
        backend.train_step([(x, y)], lr=1e-2, grad_clip=1.0, spike_threshold=None)
    return b"".join(v.tobytes() for _, v in sorted(backend.state_dict().items()))


def test_two_runs_are_bitwise_equal():
    assert _train() == _train()
