"""Activation checkpointing: gradients equal to the plain backward (dropout on, both architectures, the
torch twin too), less memory in use at the peak, and plain behaviour where nothing records."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import autograd
from autograd.checkpoint import checkpoint
from autograd.nn import GPT, GPTConfig
from helios import runtime as rt
from trainer.backends.torch_model import GPT as TorchGPT
from trainer.config import ModelConfig

B, T, V = 2, 33, 257


def _config(arch: str, n_layer: int = 2, dropout: float = 0.1) -> GPTConfig:
    extra = dict(n_kv_head=1, bias=False, tie_embeddings=False) if arch == "llama" else {}
    return GPTConfig(arch=arch, n_layer=n_layer, n_embd=64, n_head=4, block_size=T, vocab_size=V, dropout=dropout,
                     **extra)


def _batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, V, (B, T), dtype=np.int32), rng.integers(0, V, (B, T), dtype=np.int32))


def _loss_and_grads(model: GPT, mode: str) -> tuple[float, np.ndarray]:
    model.checkpoint_activations = mode
    model.zero_grad()
    x, y = _batch()
    loss = model(x, y, forward_index=5)
    loss.backward()
    return loss.item(), model.arena.grads.numpy().copy()


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_checkpointed_gradients_equal_the_plain_backward(arch):
    model = GPT(_config(arch), seed=1)
    loss_plain, grads_plain = _loss_and_grads(model, "none")
    loss_ckpt, grads_ckpt = _loss_and_grads(model, "block")
    assert loss_ckpt == loss_plain
    assert np.abs(grads_plain).max() > 0
    # Same kernels, same order, same dropout masks: equal to within 1e-6 of the gradient's scale.
    np.testing.assert_allclose(grads_ckpt, grads_plain, rtol=0, atol=1e-6 * np.abs(grads_plain).max())


def test_checkpointing_lowers_the_peak_of_memory_in_use():
    model = GPT(_config("gpt2", n_layer=4, dropout=0.0), seed=2)
    pool = rt.get_runtime().pool
    peaks = {}
    for mode in ("none", "block", "none"):
        rt.sync()
        pool.reset_peak()
        _loss_and_grads(model, mode)
        rt.sync()
        peaks[mode] = pool.reset_peak()
    assert peaks["block"] < peaks["none"], peaks


def test_no_recording_means_a_plain_call():
    model = GPT(_config("gpt2", dropout=0.0), seed=3)
    x = autograd.tensor(np.ones((B, T, 64), np.float32))
    with autograd.no_grad():
        out = checkpoint(model.h[0], x)
    assert out.grad_fn is None
    np.testing.assert_array_equal(out.numpy(), model.h[0](x).numpy())


def test_torch_twin_checkpointing_gives_the_same_gradients():
    mc = ModelConfig(**dataclasses.asdict(_config("llama", dropout=0.0)))
    x, y = (torch.tensor(a, dtype=torch.long) for a in _batch())
    grads = {}
    for mode in ("none", "block"):
        torch.manual_seed(0)
        tmodel = TorchGPT(mc)
        tmodel.init_weights(0)
        tmodel.checkpoint_activations = mode
        loss = torch.nn.functional.cross_entropy(tmodel(x).view(-1, V), y.view(-1))
        loss.backward()
        grads[mode] = {n: p.grad.clone() for n, p in tmodel.named_parameters()}
    for name, g in grads["none"].items():
        torch.testing.assert_close(grads["block"][name], g, rtol=0, atol=1e-6)
