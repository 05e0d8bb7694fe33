"""`trainer eval` on fine-tuned runs, both splits, the whole split; and pointing a shipped config at one's own
text from the command line. From the CLI, as a user would (torch backend: these are about the trainer)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch  # noqa: F401  (a pinned test dependency: a missing torch is an error, not a skip)

from tests.trainer.conftest import make_corpus

REPO = Path(__file__).resolve().parents[2]
SHORT = {"max_iters": 4, "ckpt_interval": 4, "sample_tokens": 0}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture
def fine_tuned(make_config, tmp_path) -> tuple[Path, Path]:
    """(run directory, its text): a run fine-tuned with init_from on a text of its own."""
    assert _cli("run", str(make_config("base", train=SHORT)), "--backend", "torch").returncode == 0
    text = tmp_path / "new.txt"
    text.write_text(make_corpus(600, seed=9), encoding="utf-8")
    config = make_config("tuned", data={"path": str(text)},
                         train=dict(SHORT, init_from=str(tmp_path / "runs" / "base")))
    done = _cli("run", str(config), "--backend", "torch")
    assert done.returncode == 0, done.stderr
    return tmp_path / "runs" / "tuned", text


def test_eval_both_splits_of_a_fine_tuned_run(fine_tuned):
    run_dir, _ = fine_tuned
    done = _cli("eval", "--run", str(run_dir), "--split", "both", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert np.isfinite(result["train_loss"]) and np.isfinite(result["val_loss"])
    train = _cli("eval", "--run", str(run_dir), "--split", "train")
    assert train.returncode == 0 and "train loss" in train.stdout, train.stderr


def test_eval_prints_the_val_result_before_the_train_split_fails(fine_tuned):
    run_dir, text = fine_tuned
    text.unlink()  # the run directory keeps its val tokens, not its training text
    done = _cli("eval", "--run", str(run_dir), "--split", "both")
    assert done.returncode == 2 and "needs the training data" in done.stderr and done.stderr.count("\n") == 1
    assert done.stdout.startswith("ckpt-4 (step 4): val loss ") and "train loss" not in done.stdout
    as_json = _cli("eval", "--run", str(run_dir), "--split", "both", "--json")
    assert as_json.returncode == 2 and "val_loss" in json.loads(as_json.stdout)


def test_eval_iters_all_scores_every_window_of_the_split(make_config, tmp_path):
    assert _cli("run", str(make_config("whole", train=SHORT)), "--backend", "torch").returncode == 0
    run_dir = tmp_path / "runs" / "whole"
    done = _cli("eval", "--run", str(run_dir), "--eval-iters", "all", "--json", "--backend", "torch")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    # An independent oracle: every block_size window of the kept val tokens, one at a time.
    from trainer.session import load_run

    loaded = load_run(run_dir, "torch")
    val, block = np.asarray(loaded.data.val), loaded.cfg.model.block_size
    windows = [val[s:s + block + 1].astype(np.int32) for s in range(0, len(val) - block, block)]
    expect = np.mean([loaded.backend.eval_loss(w[None, :-1], w[None, 1:]) for w in windows])
    assert result["eval_iters"] == "all" and result["val_tokens"] == len(windows) * block
    assert result["val_tokens"] > len(val) - block - 1
    assert result["val_loss"] == pytest.approx(expect, rel=1e-5)
    text = _cli("eval", "--run", str(run_dir), "--eval-iters", "all", "--backend", "torch")
    assert text.returncode == 0 and f"{result['val_tokens']:,} tokens" in text.stdout


@pytest.mark.parametrize("args, needle", [(["--eval-iters", "some"], "at least 1 (a whole number) or all, got some"),
                                          (["--eval-iters", "-3"], "got -3")])
def test_eval_iters_bad_values_are_one_line(make_config, tmp_path, args, needle):
    done = _cli("eval", "--run", str(tmp_path / "nowhere"), *args)
    assert done.returncode == 2 and needle in done.stderr and done.stderr.count("\n") == 1


def test_a_shipped_config_reads_ones_own_text_from_the_command_line(tmp_path, corpus):
    own = tmp_path / "own.txt"
    shutil.copy(corpus, own)
    shipped = str(REPO / "configs" / "shakespeare.toml")
    done = _cli("config", shipped, f"--data.path={own}", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)["config"]["data"]
    assert data["path"] == str(own) and data["dataset"] is None
    reset = _cli("config", shipped, "--data.dataset=none", f"--data.path={own}", "--json")
    assert reset.returncode == 0 and json.loads(reset.stdout)["config"]["data"]["dataset"] is None, reset.stderr
    prepared = _cli("prepare", shipped, f"--data.path={own}", "--model.vocab_size=300")
    assert prepared.returncode == 0, prepared.stderr
    assert str(own) in prepared.stdout and (tmp_path / "own.txt.helios").is_dir()
    both = _cli("config", shipped, f"--data.path={own}", "--data.dataset=shakespeare")  # both typed: ambiguous
    assert both.returncode == 2 and "set either dataset or path, not both" in both.stderr


def test_none_resets_an_optional_string_key_and_is_refused_for_a_required_one(tmp_path):
    shipped = str(REPO / "configs" / "shakespeare.toml")
    done = _cli("config", shipped, "--data.dataset=none", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["config"]["data"]["dataset"] == "shakespeare"  # the default when no path
    required = _cli("config", shipped, "--train.max_iters=none")
    assert required.returncode == 2 and "[train] max_iters = none is not allowed" in required.stderr
