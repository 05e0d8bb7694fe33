"""Small CLI defects users hit: a closed stdout pipe (`| head`) and non-finite sampling settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _trainer(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=REPO, text=True, timeout=300, **kw)


def test_a_closed_stdout_pipe_is_not_a_traceback(make_config, tmp_path):
    config = make_config("piped", train={"max_iters": 6, "log_interval": 1, "sample_tokens": 0})
    shell = f"{sys.executable} -m trainer run {config} | head -n 1"
    done = subprocess.run(["bash", "-o", "pipefail", "-c", shell], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr
    assert (tmp_path / "runs" / "piped" / "latest").exists()  # the run finished and saved


@pytest.mark.parametrize("bad", [["--temperature", "nan"], ["--temperature", "inf"], ["--temperature", "-1"],
                                 ["--tokens", "-3"]])
def test_sample_refuses_non_finite_or_negative_settings(make_config, tmp_path, bad):
    config = make_config("s", train={"max_iters": 2, "sample_tokens": 0})
    assert _trainer("run", str(config), capture_output=True).returncode == 0
    done = _trainer("sample", "--run", str(tmp_path / "runs" / "s"), *bad, capture_output=True)
    assert done.returncode == 2
    assert "must be finite and not negative" in done.stderr and done.stderr.count("\n") == 1
    assert done.stdout == ""
