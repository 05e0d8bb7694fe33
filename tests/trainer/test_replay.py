"""Whole-step capture and replay in the helios backend (micro-steps and the optimizer step): bit-identical to
lazy recording with dropout and grad_accum, falls back and recaptures when a shape or setting changes, survives
NaN skips and resumes, and records no dispatches on the host when it replays."""

from __future__ import annotations

import numpy as np
import pytest

from helios import runtime as rt
from trainer.backends.helios import HeliosBackend
from trainer.config import ModelConfig, OptimConfig

STEPS = 20


def _model(arch: str) -> ModelConfig:
    return ModelConfig(arch=arch, vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32,
                       n_kv_head=2 if arch == "gpt2" else 1, dropout=0.1)


def _steps(backend, first: int, last: int):
    """Steps first..last-1 of a fixed schedule: grad_accum 2 from step 10, a spike setting at 5, a NaN at 7, a
    partial batch (B=1) at 15."""
    out = []
    for s in range(first, last):
        rng = np.random.default_rng(s)
        b = 1 if s == 15 else 2
        x, y = rng.integers(0, 64, (b, 16)), rng.integers(0, 64, (b, 16))
        micro = [(x, y), (y, x)] if s >= 10 else [(x, y)]
        r = backend.train_step(micro, 1e-3 * (1 + s % 3), 1.0, 3.0 if s == 5 else None, inject_nan=(s == 7))
        out.append(r)
    return out


def _run(arch: str, replay: bool):
    backend = HeliosBackend.create(_model(arch), OptimConfig(), 0)
    backend.set_replay(replay)
    return backend, _steps(backend, 0, STEPS)


def _assert_same(a_results, b_results, a_state, b_state):
    assert [(r.loss, r.grad_norm, r.skipped, r.clip_coef) for r in a_results] == \
        [(r.loss, r.grad_norm, r.skipped, r.clip_coef) for r in b_results]
    assert a_state.keys() == b_state.keys()
    for k in a_state:
        np.testing.assert_array_equal(a_state[k], b_state[k], err_msg=k)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_replayed_steps_are_bit_identical_to_lazy_ones(arch):
    lazy, lazy_res = _run(arch, replay=False)
    fast, fast_res = _run(arch, replay=True)
    _assert_same(lazy_res, fast_res, lazy.state_dict(), fast.state_dict())
    assert not any(r.replayed for r in lazy_res)
    replayed = [r.replayed for r in fast_res]
    # Step 0 is lazy, 1 captures the micro-step (the optimizer step was captured at 0), then replays. The spike
    # setting (5, and back at 6) recaptures the optimizer step; the NaN step (7) is lazy; grad_accum 2 from 10
    # runs lazily once, captures at 11; the partial batch (15) runs lazily and leaves the capture in place.
    assert replayed == [False, False, True, True, True, False, False, False, True, True,
                        False, False, True, True, True, False, True, True, True, True]
    assert fast_res[7].skipped == "nan" and fast.opt.step_count == STEPS - 1  # unstep after the skip
    assert all(r.record_ms == 0.0 for r, flag in zip(fast_res, replayed, strict=True) if flag)


@pytest.mark.parametrize("accum", [1, 2])
def test_a_replayed_step_records_no_dispatches(accum):
    backend = HeliosBackend.create(_model("gpt2"), OptimConfig(), 0)
    x = np.arange(32).reshape(2, 16) % 64
    micro = [(x, x)] * accum
    rt.reset_counters()
    backend.train_step(micro, 1e-3, 1.0, None)  # lazy
    lazy = rt.counters()["dispatches"]
    backend.train_step(micro, 1e-3, 1.0, None)  # captures
    rt.reset_counters()
    res = backend.train_step(micro, 1e-3, 1.0, None)
    assert res.replayed and lazy > 20 * accum
    assert rt.counters()["dispatches"] == 0


def test_replay_follows_new_batches_not_the_captured_one():
    """A replay reads the batch written into its fixed inputs (ids, targets, scatter plan, dropout counter):
    the losses of different batches differ, and equal the lazy ones."""
    lazy, fast = (HeliosBackend.create(_model("gpt2"), OptimConfig(), 0) for _ in range(2))
    fast.replay, lazy.replay = True, False
    rng = np.random.default_rng(1)
    for _ in range(5):
        x = rng.integers(0, 64, (2, 16))
        y = np.roll(x, 1)
        a, b = lazy.train_step([(x, y)], 1e-3, 0.0, None), fast.train_step([(x, y)], 1e-3, 0.0, None)
        assert (a.loss, a.grad_norm) == (b.loss, b.grad_norm)
    assert b.replayed


def test_replay_with_checkpointed_activations_is_bit_identical():
    runs = []
    for replay in (False, True):
        backend = HeliosBackend.create(_model("gpt2"), OptimConfig(), 0)
        backend.set_activation_checkpointing("block")
        backend.set_replay(replay)
        runs.append((backend, _steps(backend, 0, 6)))
    (lazy, lazy_res), (fast, fast_res) = runs
    _assert_same(lazy_res, fast_res, lazy.state_dict(), fast.state_dict())
    assert [r.replayed for r in fast_res] == [False, False, True, True, True, False]


def test_eval_and_sampling_between_replays_change_nothing():
    """Eval (another shape, no dropout) and sampling run lazily beside the captures and do not disturb them."""
    runs = []
    for replay in (False, True):
        backend = HeliosBackend.create(_model("llama"), OptimConfig(), 0)
        backend.set_replay(replay)
        res = _steps(backend, 0, 4)
        x = np.arange(48).reshape(3, 16) % 64
        extra = (backend.eval_loss(x, x), backend.generate(x[0, :5], 6, 1.0, 4, np.random.default_rng(0)).tolist())
        runs.append((backend, res + _steps(backend, 4, 8), extra))
    (lazy, lazy_res, lazy_extra), (fast, fast_res, fast_extra) = runs
    assert lazy_extra == fast_extra
    _assert_same(lazy_res, fast_res, lazy.state_dict(), fast.state_dict())
    assert [r.replayed for r in fast_res] == [False, False, True, True, True, False, False, False]


def test_resume_under_replay_is_bit_exact():
    full, full_res = _run("llama", replay=True)
    first = HeliosBackend.create(_model("llama"), OptimConfig(), 0)
    _steps(first, 0, 12)
    state = first.state_dict()
    resumed = HeliosBackend.create(_model("llama"), OptimConfig(), 0)
    _steps(resumed, 0, 1)  # captured before the resume: load_state_dict must drop that capture
    resumed.load_state_dict(state)
    rest = _steps(resumed, 12, STEPS)
    _assert_same(full_res[12:], rest, full.state_dict(), resumed.state_dict())
    assert [r.replayed for r in rest] == [False, False, True, False, True, True, True, True]  # 15: partial batch


VALIDATED = """
import numpy as np
from helios.device import get_device
from trainer.backends.helios import HeliosBackend
from trainer.config import ModelConfig, OptimConfig
cfg = ModelConfig(arch="llama", vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16, n_kv_head=1, dropout=0.1)
backend = HeliosBackend.create(cfg, OptimConfig(), 0)
x = np.arange(16).reshape(2, 8) % 64
flags = [backend.train_step([(x, x), (x, x)], 1e-3, 1.0, None).replayed for _ in range(3)]
assert flags == [False, False, True], flags
assert get_device()._debug_messenger is not None, "the validation layer is not on"
get_device().check_validation()
print("validation clean")
"""


def test_captured_and_replayed_steps_are_validation_layer_clean():
    from tests.reliability.conftest import child_env, trainer_cli
    from tests.reliability.test_validation_layer import _has_validation_layer

    if not _has_validation_layer():
        pytest.skip("vulkan-validationlayers is not installed")
    env = child_env(HELIOS_VALIDATE="1",
                    VK_LAYER_ENABLES="VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT")
    proc = trainer_cli(entry=("-c", VALIDATED), env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
    assert "validation clean" in proc.stdout
