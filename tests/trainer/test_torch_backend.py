"""The PyTorch reference backend: parameter names and shapes, the step contract (clip, skip, NaN), state, sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch  # noqa: F401  (a pinned test dependency: a missing torch is an error, not a skip)

from trainer.backend import Backend, create_backend, sample_logits
from trainer.config import load_config_text

GPT2 = "[model]\nn_layer = 2\nn_head = 2\nn_embd = 32\nblock_size = 16\nvocab_size = 300\n"
LLAMA = ('[model]\narch = "llama"\nn_layer = 2\nn_head = 4\nn_kv_head = 2\nn_embd = 32\nblock_size = 16\n'
         "vocab_size = 300\nbias = false\ntie_embeddings = false\n")


def _backend(text: str = GPT2, seed: int = 0) -> Backend:
    cfg = load_config_text(text)
    return create_backend("torch", cfg.model, cfg.optim, seed)


def _batch(seed: int = 0, b: int = 4, t: int = 16, vocab: int = 300):
    rng = np.random.default_rng(seed)
    w = rng.integers(0, vocab, size=(b, t + 1)).astype(np.int32)
    return w[:, :-1], w[:, 1:]


def test_gpt2_parameter_names_and_shapes():
    be = _backend()
    shapes = {k[len("param."):]: v.shape for k, v in be.state_dict().items() if k.startswith("param.")}
    assert shapes["wte.weight"] == (300, 32) and shapes["wpe.weight"] == (16, 32)
    assert shapes["h.0.ln_1.weight"] == (32,) and shapes["h.0.ln_1.bias"] == (32,)
    assert shapes["h.0.attn.c_attn.weight"] == (96, 32) and shapes["h.0.attn.c_proj.weight"] == (32, 32)
    assert shapes["h.1.mlp.c_fc.weight"] == (128, 32) and shapes["h.1.mlp.c_proj.weight"] == (32, 128)
    assert shapes["ln_f.weight"] == (32,) and "lm_head.weight" not in shapes
    assert be.num_params() == sum(math.prod(s) for s in shapes.values())


def test_llama_parameter_names_and_shapes():
    be = _backend(LLAMA)
    shapes = {k[len("param."):]: v.shape for k, v in be.state_dict().items() if k.startswith("param.")}
    hd = 32 // 4
    assert shapes["h.0.attn.c_attn.weight"] == ((4 + 2 * 2) * hd, 32)  # fused [q | k | v] rows, GQA
    # SwiGLU hidden width: 8/3 * n_embd rounded up to a multiple of 64.
    assert shapes["h.0.mlp.w_gate.weight"] == (128, 32) and shapes["h.0.mlp.w_down.weight"] == (32, 128)
    assert shapes["lm_head.weight"] == (300, 32) and "wpe.weight" not in shapes
    assert "h.0.ln_1.bias" not in shapes and "h.0.attn.c_attn.bias" not in shapes


def test_init_statistics():
    sd = _backend(GPT2.replace("n_layer = 2", "n_layer = 8")).state_dict()
    assert abs(sd["param.h.0.attn.c_attn.weight"].std() - 0.02) < 0.003
    assert abs(sd["param.h.0.attn.c_proj.weight"].std() - 0.02 / 4) < 0.001  # 0.02/sqrt(2*8)
    assert not sd["param.h.0.attn.c_attn.bias"].any() and (sd["param.h.0.ln_1.weight"] == 1).all()


@pytest.mark.parametrize("text", [GPT2, LLAMA, GPT2 + "softcap = 5.0\ndropout = 0.1\n"])
def test_training_lowers_loss_on_a_fixed_batch(text):
    be = _backend(text)
    x, y = _batch()
    first = be.eval_loss(x, y)
    assert abs(first - math.log(300)) < 0.5
    for _ in range(20):
        res = be.train_step([(x, y)], 3e-3, 1.0, None)
    assert res.skipped is None and 0 < res.clip_coef <= 1 and res.grad_norm > 0
    assert be.eval_loss(x, y) < first - 1.0


def test_grad_accumulation_matches_one_big_batch():
    x, y = _batch(b=4)
    a, b = _backend(), _backend()
    ra = a.train_step([(x, y)], 1e-3, 0.0, None)
    rb = b.train_step([(x[:2], y[:2]), (x[2:], y[2:])], 1e-3, 0.0, None)
    assert ra.loss == pytest.approx(rb.loss, rel=1e-5) and ra.grad_norm == pytest.approx(rb.grad_norm, rel=1e-4)


def test_clipping_reports_its_coefficient():
    be = _backend()
    res = be.train_step([_batch()], 1e-3, 1e-3, None)
    assert res.clip_coef == pytest.approx(1e-3 / (res.grad_norm + 1e-6))


@pytest.mark.parametrize("kind", ["nan", "spike"])
def test_skipped_step_touches_nothing(kind):
    be = _backend()
    be.train_step([_batch(1)], 1e-3, 1.0, None)
    before = be.state_dict()
    if kind == "nan":
        res = be.train_step([_batch(2)], 1e-3, 1.0, None, inject_nan=True)
    else:
        res = be.train_step([_batch(2)], 1e-3, 1.0, spike_threshold=1e-9)
    assert res.skipped == kind
    after = be.state_dict()
    assert int(after["adam_step"]) == 1
    for k, v in before.items():
        np.testing.assert_array_equal(v, after[k], err_msg=k)
    assert be.train_step([_batch(2)], 1e-3, 1.0, None).skipped is None


def test_weight_decay_skips_embeddings_norms_and_biases():
    cfg = load_config_text(GPT2 + "[optim]\nweight_decay = 0.5\nlr = 0.1\n")
    be = create_backend("torch", cfg.model, cfg.optim, 0)
    decayed = {n for n, d in zip(be.names, be.decay, strict=True) if d}
    assert "h.0.attn.c_attn.weight" in decayed and "h.1.mlp.c_proj.weight" in decayed
    assert not decayed & {"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.attn.c_attn.bias", "ln_f.bias"}


def test_state_dict_roundtrip_continues_identically():
    a = _backend()
    a.train_step([_batch(1)], 1e-3, 1.0, None)
    b = _backend(seed=99)
    b.load_state_dict(a.state_dict())
    ra, rb = a.train_step([_batch(2)], 1e-3, 1.0, None), b.train_step([_batch(2)], 1e-3, 1.0, None)
    assert ra.loss == rb.loss and ra.grad_norm == rb.grad_norm
    with pytest.raises(ValueError, match="shape"):
        _backend(GPT2.replace("n_embd = 32", "n_embd = 64")).load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="missing"):
        _backend(LLAMA).load_state_dict(a.state_dict())


def test_loads_the_helios_backends_extra_state():
    """A helios checkpoint also holds its dropout pass count and fp16's loss scale: the torch backend loads it
    (trainer.backend.OTHER_BACKENDS_STATE) and still refuses any other unknown key."""
    a = _backend()
    state = a.state_dict() | {"rng_forwards": np.array(3, np.int64),
                              "loss_scale": np.array([65536.0, 0, 0, 0], np.float32)}
    b = _backend(seed=99)
    b.load_state_dict(state)
    assert b.train_step([_batch(2)], 1e-3, 1.0, None).loss == a.train_step([_batch(2)], 1e-3, 1.0, None).loss
    with pytest.raises(ValueError, match="unexpected"):
        b.load_state_dict(state | {"loss_scale_typo": np.zeros(1, np.float32)})


def test_generate_is_seeded_and_bounded():
    be = _backend()
    prompt = np.arange(20, dtype=np.int32)  # longer than block_size: the context is cropped
    a = be.generate(prompt, 10, 0.8, 5, np.random.default_rng(1))
    b = be.generate(prompt, 10, 0.8, 5, np.random.default_rng(1))
    assert a.shape == (10,) and a.dtype == np.int32 and (a == b).all() and (a < 300).all()
    greedy = be.generate(prompt, 3, 0.0, None, np.random.default_rng(5))
    assert (greedy == be.generate(prompt, 3, 0.0, None, np.random.default_rng(6))).all()


def test_sample_logits_respects_top_k():
    logits = np.array([0.0, 5.0, 4.0, -1.0, 3.0])
    rng = np.random.default_rng(0)
    draws = {sample_logits(logits, 1.0, 2, rng) for _ in range(200)}
    assert draws == {1, 2}
    assert sample_logits(logits, 0.0, None, rng) == 1


def test_counters_and_flops():
    be = _backend()
    assert set(be.counters()) >= {"dispatches", "submits", "barriers", "pool_bytes", "device_allocs"}
    assert not any(be.counters().values()) and be.device_peak() is None
    assert be.flops_per_token() > 6 * (be.num_params() - 16 * 32)
    assert "CPU" in be.device_name()
