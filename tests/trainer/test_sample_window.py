"""Sampling past block_size (issue 38 item 27): the window slides by half a block, so a KV cache is refilled once per
block_size // 2 + 1 tokens, not once per token; cached decode (replayed steps included) gives the logits of a
full forward of the same window at every position; both backends draw the same tokens; and `trainer sample
--json` reports the refills the policy says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trainer.backend import first_window, window_refills, window_start
from trainer.config import ModelConfig, OptimConfig

REPO = Path(__file__).resolve().parents[2]
BLOCK = 16
MODEL = ModelConfig(n_layer=2, n_head=2, n_kv_head=2, n_embd=32, block_size=BLOCK, vocab_size=320, dtype="fp32")


def test_window_grows_to_block_then_slides_by_half():
    starts, start = [], first_window(1, BLOCK)
    for length in range(1, 60):
        start = window_start(length, start, BLOCK)
        starts.append(start)
        assert 1 <= length - start <= BLOCK
    slides = [length for length, (a, b) in enumerate(zip(starts, starts[1:], strict=False), start=2) if a != b]
    assert slides[0] == BLOCK + 1  # the first draw with a context longer than the block
    assert np.diff(slides).tolist() == [BLOCK // 2 + 1] * (len(slides) - 1)
    for length in slides:  # after a slide the window holds the last half block
        assert length - starts[length - 1] == BLOCK // 2
    assert window_refills(1, 59, BLOCK) == len(slides)
    assert first_window(40, BLOCK) == 40 - BLOCK  # a long prompt: its last block, no refill counted yet
    assert window_refills(40, 1, BLOCK) == 0


def _draws(prompt: list[int], n: int, seed: int = 3) -> list[list[int]]:
    """The window of each of n draws after prompt, the drawn ids random (the test feeds, it does not sample)."""
    rng = np.random.default_rng(seed)
    ids, start, windows = list(prompt), first_window(len(prompt), BLOCK), []
    for _ in range(n):
        start = window_start(len(ids), start, BLOCK)
        windows.append(ids[start:])
        ids.append(int(rng.integers(0, MODEL.vocab_size)))
    return windows


@pytest.mark.parametrize("prompt_len", [1, 7, 33])
def test_cached_decode_matches_full_forward_across_slides(prompt_len):
    import autograd
    from autograd.nn.decode import KVCache
    from trainer.backends.helios import HeliosBackend

    backend = HeliosBackend.create(MODEL, OptimConfig(), seed=5)
    model = backend.model
    model.eval()
    prompt = [int(i) for i in np.random.default_rng(prompt_len).integers(0, MODEL.vocab_size, prompt_len)]
    windows = _draws(prompt, 3 * BLOCK)  # past the block three times: slides, then replayed positions
    cache = KVCache(model, capture=True)
    worst = 0.0
    try:
        with autograd.no_grad():
            for i, window in enumerate(windows):
                slid = i == 0 or window[:-1] != windows[i - 1]
                if slid:
                    cache.reset()
                    logits = cache.feed(window)
                else:
                    logits = cache.feed(window[-1:])
                cached = logits.numpy().reshape(-1)
                full = model(autograd.tensor(np.asarray([window], np.int32))).data.numpy()[0, -1]
                worst = max(worst, float(np.abs(cached - full).max() / (np.abs(full).max() + 1e-12)))
                assert np.allclose(cached, full, rtol=1e-4, atol=1e-5), (i, len(window))
        assert cache.replays > 0  # positions filled before were replayed, and still matched
    finally:
        cache.close()
    assert worst < 1e-4


def test_helios_and_torch_draw_the_same_tokens_past_the_block():
    from trainer.backends.helios import HeliosBackend
    from trainer.backends.torch_ref import TorchBackend

    helios = HeliosBackend.create(MODEL, OptimConfig(), seed=9)
    torch_side = TorchBackend.create(MODEL, OptimConfig(), seed=0)
    torch_side.load_state_dict(helios.state_dict())
    prompt = np.array([3, 1, 4], np.int32)
    n = 3 * BLOCK
    a = helios.generate(prompt, n, 0.8, 20, np.random.default_rng(11))
    b = torch_side.generate(prompt, n, 0.8, 20, np.random.default_rng(11))
    assert a.tolist() == b.tolist()
    expected = window_refills(len(prompt), n, BLOCK)
    assert expected >= 4
    assert helios.sample_stats.refills == torch_side.sample_stats.refills == expected
    assert helios.sample_stats.tokens == n


def test_cli_sample_past_block_size_reports_the_policy_refills(make_config, tmp_path):
    config = make_config("window", train={"max_iters": 4, "sample_tokens": 0})
    done = subprocess.run([sys.executable, "-m", "trainer", "run", str(config)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    run = str(tmp_path / "runs" / "window")
    prompt = "The king"
    sampled = subprocess.run([sys.executable, "-m", "trainer", "sample", "--run", run, "--tokens", "300", "--seed",
                              "1", "--prompt", prompt, "--ignore-eot", "--json"], cwd=REPO, capture_output=True,
                             text=True, timeout=300)
    assert sampled.returncode == 0, sampled.stderr[-2000:]
    record = json.loads(sampled.stdout.strip().splitlines()[-1])
    assert record["event"] == "sample" and record["tokens"] == 300 and record["block_size"] == BLOCK
    from tokenizers import Tokenizer

    from trainer import run_artifacts

    tokenizer = Tokenizer.from_file(str(Path(run) / run_artifacts.TOKENIZER))
    prompt_len = len(tokenizer.encode(prompt, add_special_tokens=False).ids)
    assert record["refills"] == window_refills(prompt_len, 300, BLOCK) > 300 // BLOCK
    assert record["text"] and record["tok_s"] > 0
