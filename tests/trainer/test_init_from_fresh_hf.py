"""init_from a freshly initialised Hugging Face GPT-2 (made with transformers, offline): its biases are all zero,
yet the file holds them, so a `bias = true` run loads it (it was refused, named as lacking ln_f.bias), and a
`bias = false` run loads it too (zero biases are no biases); non-zero biases into `bias = false` are refused
naming bias."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch  # noqa: F401  (a pinned test dependency: a missing torch is an error, not a skip)

from tests.trainer.conftest import make_corpus, write_config
from trainer.checkpoint import load_latest

transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
FROZEN = {"optim": {"lr": 1e-9, "weight_decay": 0.0}, "schedule": {"warmup_iters": 0, "min_lr": 0.0}}


def _run(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", "run", str(config), "--backend", "torch"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def fresh_hf(tmp_path_factory) -> Path:
    """A 2-layer GPT2LMHeadModel as transformers initialises it (zero biases), with a BPE tokenizer.json."""

    from trainer.tokens import train_bpe

    out = tmp_path_factory.mktemp("fresh") / "gpt2"
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=16, vocab_size=320,
                                 bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg)
    model.save_pretrained(out, safe_serialization=True)
    (out / "tokenizer.json").write_text(train_bpe(make_corpus(300), 320).to_str(), encoding="utf-8")
    return out


def _params(run_dir: Path) -> dict[str, np.ndarray]:
    return {k[len("param."):]: v for k, v in load_latest(run_dir).tensors.items() if k.startswith("param.")}


def test_a_fresh_hf_gpt2_with_zero_biases_loads_into_a_bias_true_run(tmp_path, corpus, fresh_hf):
    from safetensors.numpy import load_file

    hf = load_file(str(fresh_hf / "model.safetensors"))
    assert not np.any(hf["transformer.ln_f.bias"]) and "transformer.ln_f.bias" in hf
    config = write_config(tmp_path, corpus, "tuned", model={"bias": True},
                          train={"init_from": str(fresh_hf), "max_iters": 1, "sample_tokens": 0}, **FROZEN)
    done = _run(config)
    assert done.returncode == 0, done.stderr  # before the fix: "bias false there, true here; ... lacks: ln_f.bias"
    mine = _params(tmp_path / "runs" / "tuned")
    assert "ln_f.bias" in mine and "h.0.attn.c_attn.bias" in mine
    assert np.allclose(mine["wte.weight"], hf["transformer.wte.weight"], rtol=0, atol=1e-7)
    assert np.allclose(mine["h.1.mlp.c_fc.weight"], hf["transformer.h.1.mlp.c_fc.weight"].T, rtol=0, atol=1e-7)


def test_zero_biases_load_into_a_bias_free_run_and_real_ones_are_refused(tmp_path, corpus, fresh_hf):
    config = write_config(tmp_path, corpus, "nobias", model={"bias": False},
                          train={"init_from": str(fresh_hf), "max_iters": 1, "sample_tokens": 0}, **FROZEN)
    done = _run(config)
    assert done.returncode == 0, done.stderr
    assert not any(k.endswith(".bias") for k in _params(tmp_path / "runs" / "nobias"))

    import shutil

    from safetensors.numpy import load_file, save_file

    biased = tmp_path / "biased"
    shutil.copytree(fresh_hf, biased)
    weights = load_file(str(biased / "model.safetensors"))
    weights["transformer.ln_f.bias"] = np.full_like(weights["transformer.ln_f.bias"], 0.5)
    save_file(weights, str(biased / "model.safetensors"), metadata={"format": "pt"})
    refused = _run(write_config(tmp_path, corpus, "refused", model={"bias": False},
                                train={"init_from": str(biased), "max_iters": 1, "sample_tokens": 0}, **FROZEN))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr  # one line
    assert "bias true there, false here" in refused.stderr
    assert json.loads((biased / "config.json").read_text())["model_type"] == "gpt2"
