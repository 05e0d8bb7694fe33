"""Mixed precision end to end on the helios backend (issue 17): model.dtype = "bf16" and "fp16" train the
tiny parity config to within 2% of fp32's validation loss after 200 steps (fp16 with dynamic loss scaling);
a half run resumes bit for bit; step events carry the dtype and fp16's loss scale; checkpointed activations
give the same gradients as the plain backward in half too; a bad dtype is a clear config error."""

from __future__ import annotations

import numpy as np
import pytest

from autograd.nn import GPT, GPTConfig
from telemetry.events import read_events
from tests.trainer.conftest import parity_config, write_config
from trainer.backend import create_backend
from trainer.checkpoint import latest_path, load_checkpoint
from trainer.cli import main
from trainer.config import load_config
from trainer.loop import Trainer
from trainer.tokens import prepare_data

PARITY_200 = parity_config(steps=200, eval_interval=100, log_interval=50)


def _val_losses(make_config, tmp_path, dtype: str) -> tuple[dict, list]:
    cfg = load_config(make_config(f"mp_{dtype}", **{**PARITY_200, "model": {**PARITY_200["model"], "dtype": dtype}}))
    data = prepare_data(cfg)
    backend = create_backend("helios", cfg.model, cfg.optim, cfg.train.seed)
    events: list[dict] = []
    (tmp_path / dtype).mkdir()
    Trainer(cfg, backend, "helios", data, tmp_path / dtype, listener=events.append).run(None)
    evals = {e["step"]: e["val_loss"] for e in events if e["event"] == "eval"}
    return evals, [e for e in events if e["event"] == "step"]


@pytest.fixture(scope="module")
def fp32_run(tmp_path_factory, corpus):
    """The fp32 reference run, shared by both half dtypes' tests."""
    root = tmp_path_factory.mktemp("fp32")
    return _val_losses(lambda name, **sections: write_config(root, corpus, name, **sections), root, "fp32")


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_half_training_reaches_fp32_val_loss(dtype, fp32_run, make_config, tmp_path):
    ref, _ = fp32_run
    evals, steps = _val_losses(make_config, tmp_path, dtype)
    assert sorted(evals) == sorted(ref) == [100, 200]
    assert ref[200] < 0.6 * steps[0]["loss"], "fp32 did not learn: the comparison would say nothing"
    rel = abs(evals[200] - ref[200]) / ref[200]
    assert rel < 0.02, f"{dtype} val loss {evals[200]:.4f} vs fp32 {ref[200]:.4f} ({rel:.2%})"
    assert all(e["dtype"] == dtype for e in steps)
    if dtype == "fp16":
        assert all(e["loss_scale"] and e["loss_scale"] >= 1.0 for e in steps)
        overflowed = sum(e["skipped"] == "overflow" for e in steps)
        assert overflowed <= 10
        assert steps[-1]["loss_scale_overflows"] == overflowed, "the device counter counts the skipped steps"
    else:
        assert all(e["loss_scale"] is None and e["loss_scale_overflows"] is None for e in steps)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_half_run_resumes_bitwise(dtype, make_config, tmp_path):
    sections = {"model": {"dtype": dtype}, "schedule": {"warmup_iters": 2, "lr_decay_iters": 10},
                "train": {"max_iters": 10, "ckpt_interval": 0}}
    whole, split = make_config("whole", **sections), make_config("split", **sections)
    assert main(["run", str(whole), "--backend", "helios"]) == 0
    assert main(["run", str(split), "--backend", "helios", "--train.max_iters=6"]) == 0
    assert main(["run", str(split), "--backend", "helios"]) == 0

    def steps(run):
        return [(e["step"], e["loss"], e["loss_scale"]) for e in read_events(tmp_path / "runs" / run)
                if e["event"] == "step"]

    assert [s for s, _, _ in steps("whole")] == list(range(1, 11)) and steps("whole") == steps("split")
    a, b = (load_checkpoint(latest_path(tmp_path / "runs" / r)) for r in ("whole", "split"))
    assert a.step == b.step == 10
    for k, v in a.tensors.items():
        np.testing.assert_array_equal(v, b.tensors[k], err_msg=k)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_checkpointed_activations_give_the_same_half_gradients(dtype):
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=300, dropout=0.1, dtype=dtype)
    rng = np.random.default_rng(0)
    x, y = (rng.integers(0, 300, (2, 16)).astype(np.int32) for _ in range(2))
    grads = []
    for mode in ("none", "block"):
        model = GPT(cfg, seed=0)
        model.checkpoint_activations = mode
        model.zero_grad()
        model(x, y, forward_index=3).backward()
        grads.append(model.arena.grads.numpy().copy())
    assert np.isfinite(grads[0]).all() and np.abs(grads[0]).max() > 0
    np.testing.assert_array_equal(grads[0], grads[1])


def test_a_bad_dtype_is_a_config_error(make_config, capsys):
    assert main(["run", str(make_config("bad", model={"dtype": "fp8"})), "--backend", "helios"]) != 0
    err = capsys.readouterr().err
    assert "dtype" in err and "fp8" in err and "Traceback" not in err
