"""Concurrency. Two `run`s on one run directory: the second is refused (lock file) and the first goes on
undisturbed, to the bit: tests/trainer/test_signals.py (two live processes) and, with the holder's lock file
and every file checked unchanged, test_bad_input.py::test_locked_run_dir_is_refused_and_the_holder_undisturbed.

Here: two runs in different run directories that prepare one new dataset at the same moment (the shared token
cache is written with per-process temp files, then renamed)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO
from tests.reliability.conftest import child_env, write_config
from tests.trainer.conftest import make_corpus
from trainer.checkpoint import latest_path, load_checkpoint


def test_two_runs_prepare_one_new_dataset_at_once(tmp_path):
    text = tmp_path / "fresh.txt"
    text.write_text(make_corpus(seed=3), encoding="utf-8")
    procs = []
    for name in ("a", "b"):
        cfg = write_config(tmp_path / f"{name}.toml", text, tmp_path / "runs", name, model={"vocab_size": 300},
                           train={"max_iters": 2})
        procs.append(subprocess.Popen([sys.executable, "-m", "trainer", "run", str(cfg), "--backend", "helios"],
                                      cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    a, b = (load_checkpoint(latest_path(tmp_path / "runs" / n)) for n in ("a", "b"))
    assert a.state["tokenizer_sha256"] == b.state["tokenizer_sha256"]
    assert not list((tmp_path / "fresh.txt.helios").rglob(".*tmp*"))
