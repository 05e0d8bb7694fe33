"""`trainer export` writes a Hugging Face model directory whose logits in `transformers` match helios's
(gpt2 and llama, tied and untied heads, with and without biases, grouped-query attention)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")  # a test-only dependency (the `test` extra)
import torch  # noqa: E402

import autograd  # noqa: E402
from trainer.session import load_run  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MODELS = {
    "gpt2": {"arch": "gpt2"},
    "gpt2-untied-nobias": {"arch": "gpt2", "tie_embeddings": False, "bias": False},
    "llama-gqa": {"arch": "llama", "n_head": 4, "n_kv_head": 2, "bias": False, "tie_embeddings": False},
    "llama-tied-bias": {"arch": "llama", "bias": True, "tie_embeddings": True},
}


@pytest.mark.parametrize("name", list(MODELS))
def test_exported_logits_match_helios(make_config, tmp_path, name):
    config = make_config(name, model=MODELS[name], train={"max_iters": 3, "sample_tokens": 0})
    cli = [sys.executable, "-m", "trainer"]
    assert subprocess.run([*cli, "run", str(config)], cwd=REPO, capture_output=True, timeout=300).returncode == 0
    run_dir, out = tmp_path / "runs" / name, tmp_path / "hf" / name
    done = subprocess.run([*cli, "export", "--run", str(run_dir), "--out", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    ids = np.random.default_rng(0).integers(0, 320, (2, 16), dtype=np.int32)
    model = transformers.AutoModelForCausalLM.from_pretrained(out).float().eval()
    with torch.no_grad():
        theirs = model(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
    loaded = load_run(run_dir)
    with autograd.no_grad():
        ours = loaded.backend.model(autograd.tensor(ids)).numpy()
    assert np.abs(theirs - ours).max() <= 1e-4 * max(1.0, float(np.abs(ours).max()))


def test_export_refuses_what_hugging_face_cannot_hold(make_config, tmp_path):
    config = make_config("capped", model={"softcap": 30.0}, train={"max_iters": 2, "sample_tokens": 0})
    cli = [sys.executable, "-m", "trainer"]
    assert subprocess.run([*cli, "run", str(config)], cwd=REPO, capture_output=True, timeout=300).returncode == 0
    done = subprocess.run([*cli, "export", "--run", str(tmp_path / "runs" / "capped"), "--out", str(tmp_path / "x")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "softcap" in done.stderr and done.stderr.count("\n") == 1


def test_export_gives_a_tokenizer_with_an_eos_token_and_a_readable_weights_file(make_config, tmp_path):
    config = make_config("llama", model=MODELS["llama-gqa"], train={"max_iters": 2, "sample_tokens": 0})
    cli = [sys.executable, "-m", "trainer"]
    assert subprocess.run([*cli, "run", str(config)], cwd=REPO, capture_output=True, timeout=300).returncode == 0
    out = tmp_path / "hf" / "llama"
    umask = os.umask(0o022)
    os.umask(umask)
    done = subprocess.run([*cli, "export", "--run", str(tmp_path / "runs" / "llama"), "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE((out / "model.safetensors").stat().st_mode) == 0o666 & ~umask  # 0644 under umask 022
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 0 == json.loads(
        (out / "config.json").read_text())["eos_token_id"]
    text = "To be, or not to be"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text and len(ids) > 1
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    generated = model.generate(torch.tensor([ids]), max_new_tokens=3, do_sample=False, pad_token_id=tok.eos_token_id)
    assert generated.shape[1] <= len(ids) + 3
