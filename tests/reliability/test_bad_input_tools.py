"""Bad input to the commands around training (sample, eval, export, config, and the telemetry tools): exit 2,
one line on stderr naming the problem, no traceback, and nothing written or changed. `trainer run`'s own
matrix is test_bad_input.py; finer-grained variants live in tests/trainer and tests/telemetry."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.reliability.conftest import snapshot, trainer_cli, write_config

TRAINED = {"train": {"max_iters": 2, "ckpt_interval": 2}}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus) -> Path:
    """A finished 2-step run whose directory the cases copy."""
    root = tmp_path_factory.mktemp("tools")
    cfg = write_config(root / "cfg.toml", corpus, root / "runs", "tiny", **TRAINED)
    assert trainer_cli("run", str(cfg)).returncode == 0
    return root / "runs" / "tiny"


def _not_telemetry(root: Path) -> Path:
    path = root / "notes.txt"
    path.write_text("just some words\nnothing like a metrics log\n" * 50)
    return path


def _small_config(root: Path) -> Path:
    path = root / "small.toml"
    path.write_text("[model]\nn_layer = 2\n")
    return path


# name -> (argv builder given (root, run_dir), needle in the one error line)
CASES: dict[str, tuple[Callable[[Path, Path], list[str]], str]] = {
    "sample_temperature_nan": (lambda r, d: ["-m", "trainer", "sample", "--run", str(d), "--temperature", "nan"],
                               "must be finite and not negative"),
    "sample_zero_samples": (lambda r, d: ["-m", "trainer", "sample", "--run", str(d), "--num-samples", "0"],
                            "--num-samples must be at least 1"),
    "sample_not_a_run": (lambda r, d: ["-m", "trainer", "sample", "--run", str(r / "nowhere")], "does not exist"),
    "eval_zero_iters": (lambda r, d: ["-m", "trainer", "eval", "--run", str(d), "--eval-iters", "0"],
                        "--eval-iters must be at least 1"),
    "eval_iters_not_a_number": (lambda r, d: ["-m", "trainer", "eval", "--run", str(d), "--eval-iters", "most"],
                                "--eval-iters must be at least 1 (a whole number) or all, got most"),
    "export_not_a_run": (lambda r, d: ["-m", "trainer", "export", "--run", str(r / "nowhere"), "--out",
                                       str(r / "hf")], "does not exist"),
    # Issue 38: huge values are refused before anything is sized by them (these hung or ate gigabytes).
    "config_huge_n_layer": (lambda r, d: ["-m", "trainer", "config", str(_small_config(r)),
                                          "--model.n_layer=10000000"], "at most 1,024"),
    "eval_huge_iters": (lambda r, d: ["-m", "trainer", "eval", "--run", str(d), "--eval-iters", "100000000"],
                        "at most 100,000 batches"),
    "eval_iters_past_the_val_split": (lambda r, d: ["-m", "trainer", "eval", "--run", str(d), "--eval-iters",
                                                    "90000"], "val split's"),
    "spirv_dis_without_a_variant": (lambda r, d: ["-m", "helios.spirv", "dis", "softmax"], "softmax:VARIANT"),
    "config_missing_file": (lambda r, d: ["-m", "trainer", "config", str(r / "nope.toml")], "cannot read config"),
    "summary_of_a_text_file": (lambda r, d: ["-m", "telemetry", "summary", str(_not_telemetry(r))],
                               "is not a helios metrics log"),
    "plot_to_a_text_file": (lambda r, d: ["-m", "telemetry", "plot", str(d), "-o", str(r / "x.txt")], ".png"),
    "watch_a_mistyped_run": (lambda r, d: ["-m", "telemetry", "watch", str(r / "no" / "such" / "run")],
                             "check the path"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_tool_bad_input_is_one_clear_line_exit_2_and_changes_nothing(name, tmp_path, trained):
    build, needle = CASES[name]
    run_dir = tmp_path / "runs" / "tiny"
    shutil.copytree(trained, run_dir)
    argv = build(tmp_path, run_dir)  # builds any input file the case needs before the snapshot
    before = snapshot(tmp_path)
    proc = trainer_cli(*argv[2:], entry=tuple(argv[:2]), timeout=120)
    err = proc.stderr.strip()
    print(f"[{name}] exit {proc.returncode}: {err}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and err.count("\n") == 0, proc.stderr
    assert needle in err, err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("module,needle", [("helios.spirv", "dis       print the disassembly"),
                                           ("helios.bench", "usage: python -m helios.bench")])
def test_help_is_readable_on_stdout_and_exits_0(module, needle):
    proc = trainer_cli("--help", entry=("-m", module), timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert needle in proc.stdout and "VARIANT] |" not in proc.stdout, proc.stdout
