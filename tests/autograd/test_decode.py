"""KV-cached decoding gives the logits of the full forward pass, for prompts fed at once or token by token."""

from __future__ import annotations

import numpy as np
import pytest

import autograd
from autograd.nn import GPT, GPTConfig
from autograd.nn.decode import KVCache

CONFIGS = {
    "gpt2": GPTConfig(arch="gpt2", n_layer=2, n_embd=64, n_head=4, block_size=24, vocab_size=301),
    "llama": GPTConfig(arch="llama", n_layer=2, n_embd=64, n_head=4, n_kv_head=2, block_size=24, vocab_size=301,
                       bias=False, tie_embeddings=False, softcap=5.0),
}


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_cached_logits_match_full_forward(arch):
    cfg = CONFIGS[arch]
    model = GPT(cfg, seed=1)
    model.eval()
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, cfg.block_size).astype(np.int32)
    with autograd.no_grad():
        full = model(autograd.tensor(ids[None])).numpy().reshape(cfg.block_size, -1)
        cache = KVCache(model)
        got = [cache.feed(ids[:5]).numpy()[0]]  # a prompt in one call, then one token at a time
        got += [cache.feed(ids[i:i + 1]).numpy()[0] for i in range(5, cfg.block_size)]
        assert cache.length == cfg.block_size
        with pytest.raises(ValueError):
            cache.feed(ids[:1])  # full: the caller slides the window by reset() and a new prompt
        cache.reset()
        again = cache.feed(ids[3:9]).numpy()[0]
        prefix = model(autograd.tensor(ids[None, 3:9])).numpy().reshape(6, -1)[-1]
    np.testing.assert_allclose(np.stack(got), full[4:], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(again, prefix, rtol=1e-4, atol=1e-5)


def test_supports_needs_aligned_rows():
    assert KVCache.supports(CONFIGS["gpt2"])
    assert not KVCache.supports(GPTConfig(n_embd=30, n_head=3))


def test_fused_one_token_steps_match_unfused_and_take_fewer_dispatches():
    """One-token steps through the fused decode kernels (helios.kernels.decode) give the unfused path's logits at
    every position (t = 1 .. block_size, 3 heads of 12), in one dispatch per block + one for the head; captured, one
    capture serves every position."""
    import helios.runtime as rt
    from helios.kernels.contract import selection

    cfg = GPTConfig(arch="gpt2", n_layer=2, n_embd=36, n_head=3, block_size=9, vocab_size=37, dtype="fp32")
    model = GPT(cfg, seed=3)
    model.eval()
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, cfg.block_size).astype(np.int32)
    got, used = {}, {}
    with autograd.no_grad():
        for mode in ("fused", "unfused"):
            with selection.forcing("decode", mode):
                cache = KVCache(model)
            assert cache.fused == (mode == "fused")
            rows = []
            for i in range(cfg.block_size):
                before = rt.counters()["dispatches"]
                rows.append(cache.feed(ids[i:i + 1]).numpy()[0])
                used[mode] = rt.counters()["dispatches"] - before
            got[mode] = np.stack(rows)
    np.testing.assert_allclose(got["fused"], got["unfused"], rtol=1e-4, atol=1e-5)
    assert used["fused"] == cfg.n_layer + 1 < used["unfused"]
    with autograd.no_grad():  # captured: the first step records, every later one replays the same capture
        cache = KVCache(model, capture=True)
        replayed = [cache.feed(ids[i:i + 1]).numpy()[0].copy() for i in range(cfg.block_size)]
        assert cache.replays == cfg.block_size - 1
        cache.close()
    np.testing.assert_allclose(np.stack(replayed), got["fused"], rtol=1e-6, atol=1e-6)


def test_decode_rule_refuses_what_the_fused_kernels_do_not_cover():
    from helios.device import get_device
    from helios.kernels.decode.select import plan, refusal, shape_of

    info = get_device().info
    assert "llama" in refusal(info, shape_of(CONFIGS["llama"]), "f32")
    assert plan(CONFIGS["llama"], "f32") == "unfused"
    assert refusal(info, shape_of(CONFIGS["gpt2"]), "bf16").startswith("dtype bf16")
    assert "softcap" in refusal(info, shape_of(GPTConfig(softcap=5.0)), "f32")
