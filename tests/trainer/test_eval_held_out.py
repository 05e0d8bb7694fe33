"""`trainer eval --run R --data PATH`: the run's model on a held-out text, tokenized with the run's tokenizer and
printed like `--split val`; a bad path is one line (exit 2)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import torch  # noqa: F401  (a pinned test dependency: a missing torch is an error, not a skip)

from tests.conftest import run_python
from tests.trainer.conftest import make_corpus, write_config
from trainer.data import clean_text
from trainer.tokens import _split_point


def trainer(*args: str) -> subprocess.CompletedProcess:
    return run_python("-m", "trainer", *args, timeout=300)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, corpus):
    root = tmp_path_factory.mktemp("held")
    config = write_config(root, corpus, "base", train={"max_iters": 4, "ckpt_interval": 0, "sample_tokens": 0})
    done = trainer("run", str(config), "--backend", "torch")
    assert done.returncode == 0, done.stderr[-2000:]
    return root / "runs" / "base"


def test_eval_on_a_held_out_file_prints_its_loss_like_the_val_split(run_dir, corpus, tmp_path):
    text = clean_text(corpus.read_text(encoding="utf-8"))
    val_text = tmp_path / "val.txt"  # the run's own validation text: the same tokens, so the same loss
    val_text.write_text(text[_split_point(text, 0.1):], encoding="utf-8")
    val = trainer("eval", "--run", str(run_dir), "--json")
    same = trainer("eval", "--run", str(run_dir), "--data", str(val_text), "--json")
    assert val.returncode == 0 and same.returncode == 0, val.stderr + same.stderr
    val_loss, data = json.loads(val.stdout)["val_loss"], json.loads(same.stdout)
    assert data["data_loss"] == pytest.approx(val_loss, rel=1e-6) and "val_loss" not in data
    assert data["data"] == str(val_text)

    held = tmp_path / "held.txt"
    held.write_text(make_corpus(400, seed=21), encoding="utf-8")
    both = trainer("eval", "--run", str(run_dir), "--data", str(held), "--split", "val", "--eval-iters", "all")
    assert both.returncode == 0, both.stderr
    assert re.fullmatch(rf"ckpt-4 \(step 4\): val loss \d+\.\d{{4}} \(perplexity [\d,.]+, [\d,]+ tokens\), "
                        rf"{re.escape(str(held))} loss \d+\.\d{{4}} \(perplexity [\d,.]+, [\d,]+ tokens\)\n",
                        both.stdout), both.stdout


@pytest.mark.parametrize("case", ["missing", "empty", "too_short"])
def test_a_bad_held_out_path_is_one_line(run_dir, tmp_path, case):
    path = tmp_path / {"missing": "gone.txt", "empty": "empty.txt", "too_short": "short.txt"}[case]
    if case != "missing":
        path.write_text("" if case == "empty" else "The king.\n", encoding="utf-8")
    done = trainer("eval", "--run", str(run_dir), "--data", str(path))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainer: error: --data") and str(path) in lines[0], lines
    assert {"missing": "does not exist", "empty": "is empty", "too_short": "block_size + 1"}[case] in lines[0]
