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


# A model whose decode rows are aligned on every device (SwiftShader's 256 bytes too): 3 heads of 12.
SMALL = GPTConfig(arch="gpt2", n_layer=2, n_embd=36, n_head=3, block_size=9, vocab_size=37, dtype="fp32")


def small_model_and_ids() -> tuple[GPT, np.ndarray]:
    """SMALL's model (eval mode) and block_size token ids to decode."""
    model = GPT(SMALL, seed=3)
    model.eval()
    return model, np.random.default_rng(1).integers(0, SMALL.vocab_size, SMALL.block_size).astype(np.int32)


def one_token_rows(cache: KVCache, ids: np.ndarray, dispatches: list | None = None) -> np.ndarray:
    """The logits of feeding `ids` one token at a time (each step's dispatch count appended to `dispatches`)."""
    import helios.runtime as rt

    rows = []
    for i in range(len(ids)):
        before = rt.counters()["dispatches"]
        rows.append(cache.feed(ids[i:i + 1]).numpy()[0].copy())
        if dispatches is not None:
            dispatches.append(rt.counters()["dispatches"] - before)
    return np.stack(rows)


def test_fused_one_token_steps_match_unfused_and_take_fewer_dispatches():
    """One-token steps through the fused decode kernels (helios.kernels.decode) give the unfused path's logits at
    every position (t = 1 .. block_size, 3 heads of 12), in one dispatch per block + one for the head; captured, one
    capture serves every position."""
    from helios.kernels.contract import selection

    cfg = SMALL
    model, ids = small_model_and_ids()
    got, used = {}, {}
    with autograd.no_grad():
        for mode in ("fused", "unfused"):
            with selection.forcing("decode", mode):
                cache = KVCache(model)
            assert cache.fused == (mode == "fused")
            counts = []
            got[mode] = one_token_rows(cache, ids, counts)
            used[mode] = counts[-1]
    np.testing.assert_allclose(got["fused"], got["unfused"], rtol=1e-4, atol=1e-5)
    assert used["fused"] == cfg.n_layer + 1 < used["unfused"]
    with autograd.no_grad():  # captured: the first step records, every later one replays the same capture
        cache = KVCache(model, capture=True)
        replayed = one_token_rows(cache, ids)
        assert cache.replays == cfg.block_size - 1
        cache.close()
    np.testing.assert_allclose(replayed, got["fused"], rtol=1e-6, atol=1e-6)


def test_decode_rule_refuses_what_the_fused_kernels_do_not_cover():
    from helios.device import get_device
    from helios.kernels.decode.select import plan, refusal, shape_of

    info = get_device().info
    assert "llama" in refusal(info, shape_of(CONFIGS["llama"]), "f32")
    assert plan(CONFIGS["llama"], "f32") == "unfused"
    assert refusal(info, shape_of(CONFIGS["gpt2"]), "bf16").startswith("dtype bf16")
    assert "softcap" in refusal(info, shape_of(GPTConfig(softcap=5.0)), "f32")


def test_decode_rule_falls_back_where_the_block_kernel_binds_too_many_buffers():
    """A device allowing 16 storage buffers per stage cannot bind decode_block's 18: the "decode" rule says so and
    chooses "unfused" (forcing "fused" too), instead of a launch the contract would refuse; the real device fuses."""
    import dataclasses

    from helios.device import get_device
    from helios.kernels.contract import selection
    from helios.kernels.decode.select import refusal, shape_of

    info = get_device().info
    shape = shape_of(CONFIGS["gpt2"])
    assert refusal(info, shape, "f32") is None and selection.choose("decode", shape, "f32", info=info) == "fused"
    few = dataclasses.replace(info, max_per_stage_storage_buffers=16)
    why = refusal(few, shape, "f32")
    assert why is not None and "decode_block" in why and "18 storage-buffer bindings" in why, why
    assert "maxPerStageDescriptorStorageBuffers 16" in why
    assert selection.choose("decode", shape, "f32", info=few) == "unfused"
    with selection.forcing("decode", "fused"):
        assert selection.choose("decode", shape, "f32", info=few) == "unfused"


_DECODE_UNDER_LIMITS = """
import numpy as np
import autograd
from autograd.nn.decode import KVCache
from tests.autograd.test_decode import SMALL, one_token_rows, small_model_and_ids
model, ids = small_model_and_ids()
with autograd.no_grad():
    full = model(autograd.tensor(ids[None])).numpy().reshape(SMALL.block_size, -1)
    cache = KVCache(model)
    rows = one_token_rows(cache, ids)
np.testing.assert_allclose(rows, full, rtol=1e-4, atol=1e-5)
print("fused" if cache.fused else "unfused")
"""


def test_decoding_on_a_device_with_16_storage_buffers_per_stage_runs_unfused(tmp_path):
    """End to end under HELIOS_DEVICE_LIMITS: a profile that takes nothing away but maxPerStageDescriptorStorageBuffers
    (16) decodes unfused with the full forward's logits, and `helios info` lists training open, the fused block
    kernel closed naming its bindings."""
    import json

    from helios.device import device_limits as dl
    from tests.conftest import run_python

    everything = {m: True for m in (*dl.FEATURES.values(), "bufferDeviceAddress", "pushDescriptor")}
    profile = tmp_path / "sixteen.json"
    profile.write_text(json.dumps({
        "capabilities": {"base": {
            "features": {"VkPhysicalDeviceVulkan12Features": everything},
            "properties": {"VkPhysicalDeviceProperties": {"limits": {"maxPerStageDescriptorStorageBuffers": 16}}}}},
        "profiles": {"VP_TEST_sixteen": {"api-version": "1.3.0", "capabilities": ["base"]}}}))
    env = {"HELIOS_DEVICE_LIMITS": str(profile)}
    proc = run_python("-c", _DECODE_UNDER_LIMITS, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split() == ["unfused"]
    info = run_python("-m", "helios", "info", env=env, timeout=300)
    assert info.returncode == 0, info.stderr[-4000:]
    lines = info.stdout.splitlines()
    assert any("open" in line and "training" in line for line in lines), info.stdout
    block = [line for line in lines if "decode_block" in line]
    assert block and "refused" in block[0] and "18 storage-buffer bindings" in block[0], info.stdout
