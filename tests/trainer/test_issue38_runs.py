"""Issue 38, from the CLI as a user runs it: the data a resume trains on, a run with nothing to train, relative
data paths, choosing a checkpoint, the best checkpoint and early stopping, top-p sampling, the CSV log."""

from __future__ import annotations

import csv
import json
import subprocess
import time
from pathlib import Path

import torch  # noqa: F401  (a pinned test dependency: a missing torch is an error, not a skip)

from tests.conftest import run_python
from tests.trainer.conftest import make_corpus, write_config

QUICK = {"train": {"max_iters": 4, "eval_interval": 2, "ckpt_interval": 0, "sample_tokens": 0}}


def trainer(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return run_python("-m", "trainer", *args, cwd=cwd)


def train(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    done = trainer("run", *args, "--backend", "torch", cwd=cwd)
    assert done.returncode == 0, done.stderr
    return done


def own_text_config(tmp_path: Path) -> tuple[Path, Path]:
    """A byte-level run (vocab 257: the tokenizer is the same for any text) on the user's own text file."""
    text = tmp_path / "mine.txt"
    text.write_text(make_corpus(600), encoding="utf-8")
    return write_config(tmp_path, text, "mine", model={"vocab_size": 257}, **QUICK), text


def test_a_changed_training_text_is_refused_on_resume_unless_allowed(tmp_path):
    config, text = own_text_config(tmp_path)
    run = tmp_path / "runs" / "mine"
    train(str(config))
    val_before = (run / "val_tokens.npy").read_bytes()
    text.write_text(text.read_text(encoding="utf-8")[:15000], encoding="utf-8")  # shortened by the user

    refused = trainer("run", str(config), "--train.max_iters=6", "--backend", "torch")
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "ckpt-4 was trained on other data" in lines[0], refused.stderr
    assert "sha256" in lines[0] and "train tokens" in lines[0] and "--allow-data-change" in lines[0]
    assert (run / "val_tokens.npy").read_bytes() == val_before  # untouched

    allowed = train(str(config), "--train.max_iters=6", "--allow-data-change")
    assert "warning: ckpt-4 was trained on other data" in allowed.stderr
    assert "val_tokens.before-4.npy" in allowed.stderr
    assert (run / "val_tokens.before-4.npy").read_bytes() == val_before
    assert (run / "val_tokens.npy").read_bytes() != val_before
    # The new checkpoint records the new data: the next resume needs no flag.
    train(str(config), "--train.max_iters=8")


def test_a_checkpoint_without_a_data_fingerprint_still_resumes_with_a_note(tmp_path):
    config, _ = own_text_config(tmp_path)
    run = tmp_path / "runs" / "mine"
    train(str(config))
    state_path = run / "ckpt-4" / "state.json"
    state = json.loads(state_path.read_text(encoding="utf-8"))
    assert state["data"]["train_tokens"] > 0 and len(state["data"]["text_sha256"]) == 64
    del state["data"]  # as written before fingerprints
    state_path.write_text(json.dumps(state), encoding="utf-8")
    again = train(str(config), "--train.max_iters=6")
    assert "ckpt-4 predates data fingerprints" in again.stderr and "resumed from ckpt-4" in again.stdout


def test_a_run_with_nothing_to_train_rewrites_nothing_and_summary_counts_training_time_only(tmp_path):
    config = write_config(tmp_path, tmp_path / "text.txt", "done", **QUICK)
    (tmp_path / "text.txt").write_text(make_corpus(600), encoding="utf-8")
    run = tmp_path / "runs" / "done"
    train(str(config))
    resolved, log = (run / "resolved.json").read_bytes(), (run / "metrics.jsonl").read_bytes()

    # README's command on a finished run: new settings, but no step runs.
    idle = train(str(config), "--train.max_iters=3", "--optim.lr=1e-3")
    assert "nothing to train: the run is at step 4 of 3" in idle.stderr
    assert (run / "resolved.json").read_bytes() == resolved and (run / "metrics.jsonl").read_bytes() == log

    time.sleep(3)  # an idle gap between two training processes
    train(str(config), "--train.max_iters=6")
    summary = run_python("-m", "telemetry", "summary", str(run), "--json")
    assert summary.returncode == 0, summary.stderr
    s = json.loads(summary.stdout)
    assert s["step"] == 6 and s["max_iters"] == 6 and s["resumes"] == 1
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert events[-1]["t"] - events[0]["t"] > 3 and 0 < s["wall_s"] < 2.5  # the gap is not training time


def test_a_relative_data_path_typed_on_the_command_line_is_stored_absolute(tmp_path):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir(), elsewhere.mkdir()
    (work / "text.txt").write_text(make_corpus(600), encoding="utf-8")
    config = write_config(tmp_path, work / "unused.txt", "rel", **QUICK)
    train(str(config), "--data.path=text.txt", cwd=work)
    run = tmp_path / "runs" / "rel"
    stored = json.loads((run / "resolved.json").read_text())["config"]["data"]["path"]
    assert stored == str(work / "text.txt")
    state = json.loads((run / "ckpt-4" / "state.json").read_text())
    assert state["config"]["data"]["path"] == stored
    both = trainer("eval", "--run", str(run), "--split", "train", "--backend", "torch", cwd=elsewhere)
    assert both.returncode == 0 and "train loss" in both.stdout, both.stderr


def test_sample_eval_and_export_take_a_chosen_checkpoint_without_moving_latest(tmp_path):
    (tmp_path / "text.txt").write_text(make_corpus(600), encoding="utf-8")
    config = write_config(tmp_path, tmp_path / "text.txt", "pick",
                          train={"max_iters": 8, "ckpt_interval": 4, "sample_tokens": 0})
    train(str(config))
    run = tmp_path / "runs" / "pick"
    ev = trainer("eval", "--run", str(run), "--ckpt", "ckpt-4", "--json", "--backend", "torch")
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout)["checkpoint"] == "ckpt-4" and json.loads(ev.stdout)["step"] == 4
    drawn = trainer("sample", "--run", str(run), "--ckpt", "ckpt-4", "--seed", "1", "--tokens", "4",
                    "--backend", "torch")
    assert drawn.returncode == 0, drawn.stderr
    out = tmp_path / "hf"
    exported = trainer("export", "--run", str(run), "--ckpt", str(run / "ckpt-4"), "--out", str(out))
    assert exported.returncode == 0 and (out / "model.safetensors").is_file(), exported.stderr
    assert (run / "latest").read_text().strip() == "ckpt-8"

    bad = trainer("eval", "--run", str(run), "--ckpt", "ckpt-9", "--backend", "torch")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"trainer: error: no checkpoint 'ckpt-9' in {run}: the checkpoints there are ckpt-4, ckpt-8 "
        "(or give a checkpoint directory's path)"]


def test_the_best_checkpoint_outlives_rotation_and_early_stopping_ends_the_run(tmp_path):
    (tmp_path / "text.txt").write_text(make_corpus(600), encoding="utf-8")
    # Every step skipped (a gradient-norm threshold no step passes): the weights never change, so the val loss
    # never improves on the first eval's.
    config = write_config(tmp_path, tmp_path / "text.txt", "patience",
                          train={"max_iters": 10, "eval_interval": 1, "ckpt_interval": 1, "keep_ckpts": 1,
                                 "sample_tokens": 0, "spike_threshold": 1e-9, "keep_best": True,
                                 "early_stop_patience": 2})
    done = train(str(config))
    assert ("early stop at step 3 of 10: the val loss has not improved for 2 evals (best "
            in done.stdout), done.stdout
    assert "at step 1, kept in ckpt-best); ckpt-3 written" in done.stdout
    run = tmp_path / "runs" / "patience"
    assert sorted(p.name for p in run.glob("ckpt-*")) == ["ckpt-3", "ckpt-best"]  # ckpt-1 rotated out, best kept
    assert (run / "latest").read_text().strip() == "ckpt-3"
    best = json.loads((run / "ckpt-best" / "state.json").read_text())
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert best["step"] == 1 and best["val_loss"] == [e["val_loss"] for e in evals if e["event"] == "eval"][0]
    assert evals[-1]["event"] == "end" and evals[-1]["reason"] == "early_stop"
    ev = trainer("eval", "--run", str(run), "--ckpt", "ckpt-best", "--json", "--backend", "torch")
    assert ev.returncode == 0 and json.loads(ev.stdout)["step"] == 1, ev.stderr

    bad = trainer("run", str(config), "--train.early_stop_patience=-1", "--backend", "torch")
    assert bad.returncode == 2 and "[train] early_stop_patience = -1 is not allowed" in bad.stderr


def test_top_p_one_is_plain_sampling_and_a_tiny_top_p_is_greedy(tmp_path):
    (tmp_path / "text.txt").write_text(make_corpus(600), encoding="utf-8")
    train(str(write_config(tmp_path, tmp_path / "text.txt", "nucleus", **QUICK)))
    run = str(tmp_path / "runs" / "nucleus")

    def sample(*args: str) -> str:
        done = trainer("sample", "--run", run, "--seed", "5", "--tokens", "24", "--top-k", "0", "--ignore-eot",
                       "--backend", "torch", *args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    plain = sample()
    assert sample("--top-p", "1.0") == plain
    assert sample("--top-p", "1e-9") == sample("--temperature", "0") != plain
    bad = trainer("sample", "--run", run, "--top-p", "0")
    assert bad.returncode == 2 and "--top-p must be above 0 and at most 1, got 0.0" in bad.stderr


def test_telemetry_csv_tables_steps_and_evals_across_a_resume_with_one_header(tmp_path):
    (tmp_path / "text.txt").write_text(make_corpus(600), encoding="utf-8")
    config = write_config(tmp_path, tmp_path / "text.txt", "table", **QUICK)
    train(str(config))
    train(str(config), "--train.max_iters=6")
    run = tmp_path / "runs" / "table"
    done = run_python("-m", "telemetry", "csv", str(run))
    assert done.returncode == 0 and done.stdout.strip() == f"{run / 'metrics.csv'} (6 rows)", done.stderr
    with open(run / "metrics.csv", newline="", encoding="utf-8") as f:
        table = list(csv.reader(f))
    header, body = table[0], table[1:]
    assert header[:5] == ["step", "t", "loss", "lr", "grad_norm"] and header[-1] == "val_loss"
    assert [int(r[0]) for r in body] == [1, 2, 3, 4, 5, 6] and all("step" not in r for r in body)
    val = {int(r[0]): r[-1] for r in body}
    assert all(float(val[s]) > 0 for s in (2, 4, 6)) and val[1] == val[3] == val[5] == ""
    assert all(float(r[2]) > 0 for r in body)
    piped = run_python("-m", "telemetry", "csv", str(run), "-o", "-")
    assert piped.returncode == 0 and piped.stdout == (run / "metrics.csv").read_text(encoding="utf-8")
