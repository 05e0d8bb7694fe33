"""User-facing defects of issue 38, each run from the CLI as a user would: SIGHUP, a NaN val loss, bad sample
arguments, a damaged val_tokens.npy, a full disk under metrics.jsonl, the help's own examples, and smaller ones."""

from __future__ import annotations

import io
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch  # noqa: F401  (a pinned test dependency: a missing torch is an error, not a skip)

from telemetry.events import read_events
from tests.conftest import REPO, run_python
from tests.trainer.conftest import TINY
from trainer.checkpoint import latest_path, load_checkpoint

QUICK = {"train": {"max_iters": 4, "eval_interval": 2, "ckpt_interval": 0, "sample_tokens": 0}}


def trainer(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_python("-m", "trainer", *args, timeout=timeout, env=env)


def one_line_error(proc: subprocess.CompletedProcess, code: int = 2) -> str:
    """The single stderr line of a refused command (no traceback), after checking its exit code."""
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("trainer: error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


# --- 1. SIGHUP -------------------------------------------------------------------------------------------------


def test_sighup_checkpoints_and_ends_like_sigterm(make_config, tmp_path):
    cfg = make_config("hup", train={"max_iters": 500, "ckpt_interval": 0, "eval_interval": 0, "sample_tokens": 0})
    run_dir = tmp_path / "runs/hup"
    env = dict(os.environ, HELIOS_STEP_DELAY_S="0.05", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "run", str(cfg), "--backend", "torch"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not [e for e in read_events(run_dir) if e["event"] == "step"]:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGHUP)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err  # before the fix: -1 (killed by SIGHUP), no checkpoint, no end event
    assert "Traceback" not in err
    end = [e for e in read_events(run_dir) if e["event"] == "end"][-1]
    assert end["status"] == "stopped" and end["reason"] == "SIGHUP"
    assert load_checkpoint(latest_path(run_dir)).step == end["step"] < 500
    assert "resume with:" in out


# --- 2. a NaN val loss ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["skip", "stop"])
def test_nan_val_loss_prints_and_ends_per_nan_policy(make_config, tmp_path, policy):
    cfg = make_config("nan", **QUICK)
    proc = trainer("run", str(cfg), "--backend", "torch", "--optim.lr=1e30", "--optim.grad_clip=0",
                   f"--train.nan_policy=\"{policy}\"")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    run_dir = tmp_path / "runs/nan"
    end = [e for e in read_events(run_dir) if e["event"] == "end"][-1]
    ckpt = load_checkpoint(latest_path(run_dir))
    if policy == "skip":
        assert proc.returncode == 0 and "val loss nan" in proc.stdout
        assert end["status"] == "done" and ckpt.step == 4
    else:
        assert proc.returncode == 3 and end["status"] == "diverged" and ckpt.step == end["step"]
    summary = run_python("-m", "telemetry", "summary", str(run_dir))
    assert summary.returncode == 0 and "Traceback" not in summary.stderr, summary.stderr


def test_progress_lines_format_none_and_nan():
    from trainer.progress import PlainProgress, describe, step_line

    nan = float("nan")
    step = {"event": "step", "step": 3, "loss": None, "lr": nan, "tok_per_s": None, "step_ms": math.inf, "mfu": nan}
    assert step_line(step, 10, "-") == "step 3/10 | loss nan | lr nan | nan tok/s | nan ms | ETA -"
    assert describe({"event": "eval", "step": 3, "val_loss": nan}) == "step 3: val loss nan"
    assert describe({"event": "eval", "step": 3, "val_loss": None}) == "step 3: val loss nan"
    assert "grad norm nan" in describe({"event": "skip", "step": 3, "reason": "nan", "grad_norm": math.inf})
    stream = io.StringIO()
    plain = PlainProgress(1, stream)
    plain({"event": "config", "start_step": 0, "max_iters": 10, "backend": "torch", "device": "cpu",
           "num_params": 1, "train_tokens": 1, "val_tokens": 1})
    plain(step)
    assert "loss nan" in stream.getvalue()


# --- 3. bad sample arguments ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, corpus):
    """A trained 2-step run directory, shared by the sample/eval tests of this module (which must not change it)."""
    from tests.trainer.conftest import write_config

    root = tmp_path_factory.mktemp("tiny_run")
    cfg = write_config(root, corpus, "t", train={"max_iters": 2, "eval_interval": 0, "sample_tokens": 0})
    done = trainer("run", str(cfg), "--backend", "torch")
    assert done.returncode == 0, done.stderr[-2000:]
    return root / "runs/t"


@pytest.mark.parametrize("bad, says", [(["--seed", "-1"], "--seed must be 0 or more"),
                                       (["--top-k", "-2"], "must be finite and not negative")])
def test_sample_refuses_bad_seed_in_one_line(tiny_run, bad, says):
    done = trainer("sample", "--run", str(tiny_run), "--tokens", "4", *bad)
    assert says in one_line_error(done) and done.stdout == ""


# --- 4. a damaged val_tokens.npy --------------------------------------------------------------------------------


def test_damaged_val_tokens(tiny_run, make_config, tmp_path):
    run_dir = tmp_path / "runs/t"  # make_config("t") below trains into this copy of tiny_run
    shutil.copytree(tiny_run, run_dir)
    val = run_dir / "val_tokens.npy"
    val.write_bytes(val.read_bytes()[:100])  # truncated: the header promises more tokens than follow

    sampled = trainer("sample", "--run", str(run_dir), "--tokens", "4", "--seed", "1")
    assert sampled.returncode == 0 and "Traceback" not in sampled.stderr, sampled.stderr[-2000:]

    evaluated = trainer("eval", "--run", str(run_dir))
    line = one_line_error(evaluated)
    assert str(val) in line and "delete it" in line

    cfg = make_config("t", train={"max_iters": 3, "eval_interval": 0, "sample_tokens": 0})  # one more step
    again = trainer("run", str(cfg), "--backend", "torch")
    line = one_line_error(again)
    assert str(val) in line and "damaged or truncated" in line

    val.unlink()  # what the line says to do: the run writes it again, and eval works
    assert trainer("run", str(cfg), "--backend", "torch").returncode == 0 and val.exists()


# --- 5. a full disk under metrics.jsonl -------------------------------------------------------------------------


def test_metrics_writer_cuts_a_refused_line_back(tmp_path):
    """A file that takes only part of a line (here: RLIMIT_FSIZE, which needs no root): the writer leaves whole
    lines only and says why in a MetricsWriteError."""
    resource = pytest.importorskip("resource")
    from telemetry.events import MetricsWriteError, MetricsWriter

    path = tmp_path / "metrics.jsonl"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death past the limit
    try:
        with MetricsWriter(path) as writer:
            writer.emit("step", step=1, loss=1.0)
            whole = path.read_bytes()
            resource.setrlimit(resource.RLIMIT_FSIZE, (len(whole) + 20, hard))
            with pytest.raises(MetricsWriteError, match="cannot append to"):
                writer.emit("step", step=2, loss=0.5, text="x" * 200)  # 20 bytes fit, the rest does not
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            assert path.read_bytes() == whole  # no half line
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)


@pytest.fixture
def full_tmpfs(tmp_path):
    """A 64 KiB tmpfs with one free page; skipped where it cannot be mounted (not root, no mount, a sandbox)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True,
                                 timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs: {exc}")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        (mnt / "filler").write_bytes(b"\0" * (15 * 4096))
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30)


def test_full_disk_under_metrics_log_is_one_line(make_config, tmp_path, full_tmpfs):
    cfg = make_config("full", train={"max_iters": 40, "eval_interval": 0, "ckpt_interval": 2, "sample_tokens": 0})
    run_dir = tmp_path / "runs/full"
    run_dir.mkdir(parents=True)
    log = full_tmpfs / "metrics.jsonl"
    (run_dir / "metrics.jsonl").symlink_to(log)  # the log on the full filesystem, the checkpoints on the big one
    done = trainer("run", str(cfg), "--backend", "torch")
    line = one_line_error(done)
    assert "cannot append to" in line and "No space left on device" in line and "resume" in line
    text = log.read_text(encoding="utf-8")
    assert text.endswith("\n") and all(json.loads(x) for x in text.splitlines())  # whole lines only
    steps = [json.loads(x)["step"] for x in text.splitlines() if '"event": "step"' in x]
    assert 2 <= steps[-1] < 40
    assert load_checkpoint(latest_path(run_dir)).step >= 2  # the checkpoint is whole


# --- 6. the help's and the docs' own examples -------------------------------------------------------------------


def test_warmup_longer_than_the_run_is_clamped_with_a_warning():
    from trainer.config import load_config
    from trainer.schedule import lr_at, warmup_warning

    cfg = load_config(REPO / "configs/shakespeare.toml", ["train.max_iters=50"])  # warmup_iters = 100
    assert warmup_warning(cfg.schedule) == "warmup_iters 100 > max_iters 50: warming up over 50 steps"
    lrs = [lr_at(i, cfg.schedule, cfg.optim.lr) for i in range(50)]
    assert lrs == sorted(lrs) and lrs[-1] == cfg.optim.lr  # the whole run warms up, to the full lr at its end
    assert warmup_warning(load_config(REPO / "configs/shakespeare.toml").schedule) is None


def _examples() -> list[str]:
    """Every `python -m trainer ...` in trainer/cli.py's --help texts and docs/TRAINER.md, as one line each."""
    import argparse

    from trainer.cli import build_parser

    parser = build_parser()
    texts = [parser.format_help()]
    for action in parser._actions:  # noqa: SLF001 (argparse keeps its subparsers only here)
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            texts += [sub.format_help() for sub in action.choices.values()]
    docs = (REPO / "docs/TRAINER.md").read_text(encoding="utf-8")
    fenced = re.findall(r"```[a-z]*\n(.*?)```", docs, flags=re.S)
    inline = re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", docs, flags=re.S))
    texts += fenced + [" ".join(span.split()) for span in inline]
    found = []
    for text in texts:
        for match in re.findall(r"python -m trainer [^\n#`]*", text):
            found.append(" ".join(match.split()))
    return found


PLACEHOLDER = re.compile(r"[\[\]|{}]|\.\.\.|^[A-Z_]+(\.toml)?$|=[A-Z]+$")


def test_every_quick_example_runs_as_printed(tmp_path, corpus):
    examples = [e for e in _examples() if not any(PLACEHOLDER.search(tok) for tok in shlex.split(e)[3:])]
    commands = {shlex.split(e)[3] for e in examples}
    assert {"run", "configs"} <= commands, examples  # the extraction finds what it should
    tiny = [f"--{section}.{key}={value}" for section, table in TINY.items() if section != "schedule"
            for key, value in table.items()]
    tiny += ["--train.max_iters=2", "--train.eval_interval=0", "--train.sample_tokens=0", "--train.eval_iters=1",
             f"--run.out_dir={tmp_path / 'runs'}"]
    for example in examples:
        argv = [re.sub(r"(?<==)mytext\.txt$", str(corpus), a) for a in shlex.split(example)[3:]]  # modulo paths
        if argv[0] == "run":  # first as `config` exactly as printed (no training): it must accept the settings
            shown = trainer("config", *[a for a in argv[1:] if not a.startswith("--backend") and a != "torch"])
            assert shown.returncode == 0, f"{example}: {shown.stderr}"
            if "--train.max_iters=50" in argv:  # shakespeare.toml warms up for 100 steps
                assert "warmup_iters 100 > max_iters 50: warming up over 50 steps" in shown.stderr
            data = [] if any(a.startswith("--data.path") for a in argv) else [f"--data.path={corpus}"]
            backend = [] if "--backend" in argv else ["--backend", "torch"]
            argv = [*argv, *backend, *data, *tiny]
        done = trainer(*argv)
        assert done.returncode == 0 and "Traceback" not in done.stderr, f"{example}: {done.stderr[-2000:]}"


# --- 7. smaller ones --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["configs", "extra"], ["export", "--run", "r", "--out", "o", "extra"]])
def test_commands_without_overrides_refuse_extra_arguments(argv):
    line = one_line_error(trainer(*argv))
    assert "unrecognized arguments: extra" in line


def test_n_head_error_names_n_head():
    line = one_line_error(trainer("config", "configs/shakespeare.toml", "--model.n_head=3"))
    assert "[model] n_head = 3 is not allowed" in line and "n_head in [1, 2, 4, 8" in line
    line = one_line_error(trainer("config", "configs/shakespeare.toml", "--model.n_embd=130"))
    assert "[model] n_embd = 130 is not allowed" in line  # no head count fits 130: n_embd is the one to change


def test_export_refuses_the_run_dir_and_non_empty_folders(tiny_run, tmp_path):
    for out in (tiny_run, tiny_run / "ckpt-2"):
        line = one_line_error(trainer("export", "--run", str(tiny_run), "--out", str(out)))
        assert "would overwrite its files" in line
        line = one_line_error(trainer("export", "--run", str(tiny_run), "--out", str(out), "--force"))
        assert "would overwrite its files" in line
    assert load_checkpoint(latest_path(tiny_run)).step == 2
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    assert "not empty" in one_line_error(trainer("export", "--run", str(tiny_run), "--out", str(busy)))
    done = trainer("export", "--run", str(tiny_run), "--out", str(busy), "--force")
    assert done.returncode == 0, done.stderr
    assert (busy / "model.safetensors").exists() and (busy / "notes.txt").read_text() == "mine"


def test_locked_run_dir_under_nproc_is_one_line(make_config, tmp_path, needs_mpiexec):
    from trainer.runlock import RunLock

    cfg = make_config("locked")
    run_dir = tmp_path / "runs/locked"
    run_dir.mkdir(parents=True)
    with RunLock(run_dir):
        done = trainer("run", str(cfg), "--backend", "torch", "--nproc", "2")
    line = one_line_error(done)
    assert f"in use by another trainer (pid {os.getpid()})" in line
    assert done.stderr.count("in use by another trainer") == 1 and "Abort" not in done.stderr, done.stderr


# --- 8. the run directory of a config, for `make train` ---------------------------------------------------------


def test_config_get_prints_one_resolved_value(make_config, tmp_path):
    cfg = make_config("where", train={"max_iters": 7})
    got = trainer("config", str(cfg), "--get", "run.dir")
    assert got.returncode == 0 and got.stdout == f"{(tmp_path / 'runs/where').resolve()}\n", got.stderr
    assert trainer("config", str(cfg), "--get", "train.max_iters", "--train.max_iters=9").stdout == "9\n"
    shipped = trainer("config", "configs/llama-tiny.toml", "--get", "run.dir")
    assert shipped.stdout.strip() == str(REPO / "runs/llama-tiny")  # what `make train CONFIG=...` now uses
    assert "valid keys: out_dir, name, dir" in one_line_error(trainer("config", str(cfg), "--get", "run.bogus"))
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert "--get run.dir" in makefile and "RUN_DIR ?= runs/shakespeare" not in makefile
