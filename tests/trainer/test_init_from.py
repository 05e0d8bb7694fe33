"""`[train] init_from`: a new run starts from another run's (or checkpoint's, or Hugging Face export's) weights
with a fresh optimizer and the source's tokenizer, on new data; a mismatched model is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.trainer.conftest import make_corpus
from trainer.checkpoint import load_latest

REPO = Path(__file__).resolve().parents[2]
# A tiny lr: one AdamW step moves each weight by about lr at most, so the result must equal the source's.
FROZEN = {"optim": {"lr": 1e-9, "weight_decay": 0.0}, "schedule": {"warmup_iters": 0, "min_lr": 0.0}}


def _run(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", "run", str(config), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def pretrained(make_config, tmp_path):
    config = make_config("base", train={"max_iters": 4, "sample_tokens": 0})
    assert _run(config).returncode == 0
    return tmp_path / "runs" / "base"


def _params(run_dir: Path) -> dict[str, np.ndarray]:
    return {k: v for k, v in load_latest(run_dir).tensors.items() if k.startswith("param.")}


@pytest.mark.parametrize("source_kind", ["run", "checkpoint", "huggingface"])
def test_fine_tuning_starts_from_the_source(make_config, tmp_path, pretrained, source_kind):
    source = {"run": pretrained, "checkpoint": pretrained / "ckpt-4", "huggingface": tmp_path / "hf"}[source_kind]
    if source_kind == "huggingface":
        done = subprocess.run([sys.executable, "-m", "trainer", "export", "--run", str(pretrained), "--out",
                               str(source)], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    new_text = tmp_path / "new.txt"
    new_text.write_text(make_corpus(600, seed=9), encoding="utf-8")
    config = make_config("tuned", data={"path": str(new_text)}, train={"max_iters": 1, "sample_tokens": 0,
                         "init_from": str(source)}, **FROZEN)
    done = _run(config)
    assert done.returncode == 0, done.stderr
    tuned = tmp_path / "runs" / "tuned"
    mine, base = _params(tuned), _params(pretrained)
    assert all(np.allclose(mine[k], base[k], rtol=0, atol=1e-7) for k in base)
    state = load_latest(tuned).state
    assert json.loads(state["tokenizer_json"]) == json.loads((pretrained / "tokenizer.json").read_text())
    assert int(np.asarray(load_latest(tuned).tensors["adam_step"])) == 1  # a fresh optimizer: one step so far
    again = _run(config, "--train.max_iters=2")  # resuming the fine-tuning run itself
    assert again.returncode == 0, again.stderr


def test_a_source_of_another_shape_is_refused(make_config, pretrained):
    config = make_config("wide", model={"n_embd": 48}, train={"init_from": str(pretrained), "sample_tokens": 0})
    done = _run(config)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "init_from" in done.stderr and "use the source's [model] settings" in done.stderr


def test_a_missing_source_is_refused(make_config, tmp_path):
    done = _run(make_config("lost", train={"init_from": str(tmp_path / "nowhere")}))
    assert done.returncode == 2 and "does not exist" in done.stderr and done.stderr.count("\n") == 1
