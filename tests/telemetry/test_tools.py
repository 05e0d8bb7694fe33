"""`python -m telemetry plot|summary|watch` on a synthetic run log, including a truncated last line."""

from __future__ import annotations

import json
import math

import pytest

from telemetry.__main__ import main
from telemetry.summary import summarize
from telemetry.watch import sparkline
from tests.conftest import run_python


@pytest.fixture
def run_dir(tmp_path):
    """A run log shaped like the trainer's: config, steps with a clip and a skip, evals, sample, ckpt, end."""
    lines = [{"event": "config", "t": 0.0, "backend": "helios", "device": "lavapipe", "num_params": 1000,
              "max_iters": 40, "start_step": 0, "train_tokens": 10, "val_tokens": 5, "resumed_from": None}]
    for i in range(1, 41):
        lines.append({"event": "step", "t": i * 0.1, "step": i, "loss": None if i == 20 else 5 * math.exp(-i / 20),
                      "lr": 1e-3, "grad_norm": None if i == 20 else 1.0 + (i % 5), "clip_coef": 0.5 if i % 5 == 4
                      else 1.0, "skipped": "nan" if i == 20 else None, "tok_per_s": 1000.0 + i, "step_ms": 50.0,
                      "fwd_ms": 20.0, "bwd_ms": 25.0, "opt_ms": 4.0, "wait_ms": 1.0, "dispatches": 120, "submits": 2,
                      "barriers": 40, "pool_bytes": 2**20 * (10 + i), "pool_peak_in_use": 2**20 * (5 + i % 7),
                      "pool_regions": 3, "pool_classes": 7,
                      "device_allocs": 1 if i < 3 else 0, "mfu": 0.05})
        if i == 20:
            lines.append({"event": "skip", "t": i * 0.1, "step": 20, "reason": "nan", "loss": None,
                          "grad_norm": None, "policy": "skip"})
        if i % 10 == 0:
            lines.append({"event": "eval", "t": i * 0.1, "step": i, "val_loss": 5 * math.exp(-i / 25)})
    lines.append({"event": "sample", "t": 4.1, "step": 40, "prompt": "\n", "text": "To be or not"})
    lines.append({"event": "ckpt", "t": 4.2, "step": 40, "path": "ckpt-40", "reason": "end", "ms": 3.0})
    lines.append({"event": "end", "t": 4.3, "step": 40, "status": "done"})
    text = "\n".join(json.dumps(x) for x in lines) + '\n{"event": "step", "t": 9, "step": 41, "lo'
    (tmp_path / "metrics.jsonl").write_text(text)
    return tmp_path


def test_plot_writes_a_png(run_dir, tmp_path, capsys):
    out = tmp_path / "plots" / "run.png"
    assert main(["plot", str(run_dir), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    assert "malformed" in capsys.readouterr().err  # the truncated last line, reported and skipped


def test_plot_cli_default_output_and_missing_log(run_dir, tmp_path):
    proc = run_python("-m", "telemetry", "plot", str(run_dir))
    assert proc.returncode == 0 and (run_dir / "metrics.png").is_file()
    assert "Traceback" not in proc.stderr
    proc = run_python("-m", "telemetry", "summary", str(tmp_path / "empty"))
    assert proc.returncode == 2 and "no metrics log" in proc.stderr


def test_summary(run_dir, capsys):
    assert main(["summary", str(run_dir), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["step"] == 40 and s["status"] == "done" and s["skips"] == {"nan": 1} and s["clipped_steps"] == 8
    assert s["best_val_loss"] == pytest.approx(5 * math.exp(-40 / 25)) and s["checkpoints"] == 1
    assert s["peak_bytes_in_use"] == 2**20 * 11 and s["pool_bytes_reserved"] == 2**20 * 50  # maxima over steps
    assert main(["summary", str(run_dir)]) == 0
    text = capsys.readouterr().out
    assert "val loss" in text and "nan: 1" in text and "1,000" in text
    assert "11 MiB peak in use, 50 MiB reserved" in text
    assert summarize([])["step"] == 0


def test_watch_once_renders_the_dashboard(run_dir):
    proc = run_python("-m", "telemetry", "watch", str(run_dir), "--once")
    assert proc.returncode == 0, proc.stderr
    for needle in ("step 40", "loss", "val loss", "tok/s", "memory", "ckpt-40", "To be or not", "done"):
        assert needle in proc.stdout, needle


def test_sparkline():
    assert sparkline([]) == ""
    assert sparkline([1, 2, 3]) == "▁▅█"
    assert len(sparkline(list(range(1000)), width=50)) == 50
    assert sparkline([2.0, 2.0]) == "▁▁"
