"""A run directory is self-contained: moved, or with its text deleted, it still samples and evaluates; sample
streams, stops at end-of-text and draws a new seed per call unless given one; eval reports perplexity and both
splits."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trainer.sampling import stream_sample
from trainer.tokens import EOT, train_bpe

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture
def moved_run(make_config, tmp_path, corpus):
    """A trained run whose directory was moved and whose training text is gone."""
    text = tmp_path / "own.txt"
    shutil.copy(corpus, text)
    config = make_config("own", data={"path": str(text)}, train={"max_iters": 4, "sample_tokens": 0})
    assert _cli("run", str(config)).returncode == 0
    moved = tmp_path / "elsewhere" / "own"
    moved.parent.mkdir()
    shutil.move(tmp_path / "runs" / "own", moved)
    text.unlink()
    shutil.rmtree(tmp_path / "own.txt.helios", ignore_errors=True)  # its token cache too
    return moved


def test_a_moved_run_without_its_text_still_evaluates_and_samples(moved_run):
    done = _cli("eval", "--run", str(moved_run), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert math.isclose(result["val_perplexity"], math.exp(result["val_loss"]), rel_tol=1e-9)
    sample = _cli("sample", "--run", str(moved_run), "--tokens", "8", "--seed", "1", "--prompt", "The")
    assert sample.returncode == 0, sample.stderr
    assert sample.stdout.startswith("The")
    train = _cli("eval", "--run", str(moved_run), "--split", "train")
    assert train.returncode == 2 and "needs the training data" in train.stderr


def test_eval_both_splits_and_eval_iters(make_config, tmp_path):
    config = make_config("both", train={"max_iters": 2, "sample_tokens": 0})
    assert _cli("run", str(config)).returncode == 0
    done = _cli("eval", "--run", str(tmp_path / "runs" / "both"), "--split", "both", "--eval-iters", "1", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["eval_iters"] == 1 and {"val_loss", "train_loss", "val_perplexity", "train_perplexity"} <= set(result)


def test_sample_seeds_differ_per_call_unless_given(make_config, tmp_path):
    config = make_config("seeds", train={"max_iters": 2, "sample_tokens": 0})
    assert _cli("run", str(config)).returncode == 0
    run = str(tmp_path / "runs" / "seeds")
    a, b = (_cli("sample", "--run", run, "--tokens", "6") for _ in range(2))
    assert a.stderr.startswith("seed ") and a.stderr != b.stderr
    c, d = (_cli("sample", "--run", run, "--tokens", "12", "--seed", "5", "--num-samples", "2") for _ in range(2))
    assert c.stdout == d.stdout and c.stdout.count("\n---\n") == 1 and c.stderr == ""


class _ScriptedBackend:
    """generate() hands out a fixed token sequence through on_token, as a real backend streams."""

    def __init__(self, tokens):
        self.tokens = tokens

    def generate(self, prompt_ids, n, temperature, top_k, rng, on_token=None, top_p=None):
        out = []
        for token in self.tokens[:n]:
            out.append(token)
            if on_token is not None and on_token(token) is False:
                break
        return np.asarray(out, np.int32)


def test_streaming_stops_at_end_of_text(corpus):
    tok = train_bpe(corpus.read_text(encoding="utf-8"), 300)
    words = tok.encode(" the king", add_special_tokens=False).ids
    eot = tok.token_to_id(EOT)
    pieces: list[str] = []
    text = stream_sample(_ScriptedBackend(words + [eot] + words), tok, "x", 50, 1.0, None,
                         np.random.default_rng(0), pieces.append)
    assert text == " the king" and "".join(pieces) == text and len(pieces) >= 2  # streamed, then stopped
    full = stream_sample(_ScriptedBackend(words + [eot] + words), tok, "x", 50, 1.0, None,
                         np.random.default_rng(0), pieces.append, stop_at_eot=False)
    assert full.count("the king") == 2
