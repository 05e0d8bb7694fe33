"""Loss parity: helios and the PyTorch reference, trained on the same model, data and schedule, reach the same
validation loss. Both start from the same weights (the reference's initialisation), so what is compared is the
arithmetic of every forward, backward and AdamW step, not two random draws. The 200-step run on
configs/shakespeare.toml is recorded in docs/BENCHMARKS.md ("Training on lavapipe")."""

from __future__ import annotations

import numpy as np
import pytest
import torch  # noqa: F401  (a pinned test dependency: a missing torch is an error, not a skip)

from tests.trainer.conftest import parity_config
from trainer.backend import create_backend
from trainer.config import load_config
from trainer.loop import Trainer
from trainer.tokens import prepare_data

PARITY = parity_config(steps=60, eval_interval=20, log_interval=20)


def _train(cfg, data, kind: str, run_dir, init: dict | None = None):
    backend = create_backend(kind, cfg.model, cfg.optim, cfg.train.seed)
    if init is not None:
        backend.load_state_dict(init)
    events: list[dict] = []
    run_dir.mkdir()
    Trainer(cfg, backend, kind, data, run_dir, listener=events.append).run(None)
    steps = [e["loss"] for e in events if e["event"] == "step"]
    evals = {e["step"]: e["val_loss"] for e in events if e["event"] == "eval"}
    return np.asarray(steps), evals


# make test runs it again at 16 lanes (LP_NATIVE_VECTOR_WIDTH=512, in test-subgroups' `-m subgroup` run): a whole
# training in every subgroup kernel's variant at another subgroup size.
@pytest.mark.subgroup
def test_helios_val_loss_matches_torch(make_config, tmp_path):
    cfg = load_config(make_config("parity", **PARITY))
    data = prepare_data(cfg)
    init = create_backend("torch", cfg.model, cfg.optim, cfg.train.seed).state_dict()
    ref_steps, ref_evals = _train(cfg, data, "torch", tmp_path / "torch", init)
    steps, evals = _train(cfg, data, "helios", tmp_path / "helios", init)

    assert sorted(evals) == sorted(ref_evals) == [20, 40, 60]
    assert ref_evals[60] < 0.6 * ref_steps[0], "the reference did not learn: the comparison would say nothing"
    for step, ref in ref_evals.items():
        rel = abs(evals[step] - ref) / ref
        assert rel < 0.02, f"step {step}: helios val loss {evals[step]:.4f} vs torch {ref:.4f} ({rel:.2%})"
    # Same start, same batches: the training losses agree step by step, far inside the 2% (measured: ~1e-7).
    assert abs(steps[0] - ref_steps[0]) < 1e-4 * ref_steps[0]
    assert np.max(np.abs(steps - ref_steps) / ref_steps) < 1e-3
