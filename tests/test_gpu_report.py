"""tools/gpu_report.sh: what it runs exists, its records are tagged per step, the report is built from them, and
one call inside a time budget keeps what it measured and skips what the budget leaves no time for."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "gpu_report.sh"


def test_every_benchmark_config_and_tool_the_report_runs_exists():
    from helios.bench.__main__ import BENCHMARKS

    text = SCRIPT.read_text()
    benches = re.findall(r"-m helios\.bench (\w+)", text)
    assert {"matmul", "attention", "replay"} <= set(benches)
    assert [b for b in benches if b not in BENCHMARKS] == []
    for path in re.findall(r"\b((?:configs|tools)/[\w./-]+\.(?:toml|py|sh))", text):
        assert (ROOT / path).is_file(), path


def test_a_wrong_part_is_refused_in_one_line():
    res = subprocess.run(["bash", str(SCRIPT), "everything"], capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "usage" in res.stderr


def test_records_are_tagged_and_the_report_names_each_step(tmp_path):
    out = "warming up\n" + json.dumps({"event": "bench", "name": "matmul", "ratio": 0.71}) + "\nnot {json\ndone 3/3\n"
    tagged = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_report.py"), "--records", "matmul_fp32", "0",
                             "12345"], input=out, capture_output=True, text=True, check=True).stdout
    (tmp_path / "kernels.jsonl").write_text(tagged)
    info = json.dumps({"name": "NVIDIA H100", "device_type": "discrete_gpu", "subgroup_size": 32})
    (tmp_path / "tests.jsonl").write_text(subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gpu_report.py"), "--records", "info", "0", "400"], input=info,
        capture_output=True, text=True, check=True).stdout)
    subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_report.py"), "--report", str(tmp_path)], check=True,
                   capture_output=True)
    report = json.loads((tmp_path / "report.json").read_text())
    steps = {s["step"]: s for s in report["steps"]}
    assert steps["matmul_fp32"] == {"event": "report_step", "step": "matmul_fp32", "status": "ok", "rc": 0,
                                    "seconds": 12.3, "limit_s": None, "last": "done 3/3"}
    assert report["figures"]["matmul_fp32"][0]["ratio"] == 0.71
    md = (tmp_path / "report.md").read_text()
    assert "NVIDIA H100" in md and "| matmul_fp32 | ok | 0 | 12.3 | - |" in md and "0.71x" in md


def test_bench_tune_takes_its_family_as_an_argument_not_a_benchmark_name(tmp_path):
    """`python -m helios.bench tune matmul` (the command docs and the report run) reaches tune with its family."""
    res = subprocess.run([sys.executable, "-m", "helios.bench", "tune", "matmul", "--shapes", "8x8x8", "--layouts",
                          "nn", "--quick", "--dry-run"], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "HELIOS_CACHE_DIR": str(tmp_path)})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "nn:8x8x8 ->" in res.stdout


def test_tuned_figures_are_set_beside_the_tiling_the_table_picks():
    sys.path.insert(0, str(ROOT / "tools"))
    from gpu_report import tune_vs_table

    def rec(tiling, ms, winner):
        return {"kernel": "matmul_nn", "shape": "64x32x16", "tiling": tiling, "ms": ms, "gflops": 1 / ms,
                "winner": winner}

    records = [rec("tiled32", 2.0, False), rec("tiled64", 1.0, True), rec("tiled128", 4.0, False)]
    assert tune_vs_table(records, lambda M, N: "tiled32" if (M, N) == (64, 32) else "?") == [
        {"event": "tune_vs_table", "kernel": "matmul_nn", "shape": "64x32x16", "table_tiling": "tiled32",
         "table_gflops": 0.5, "tuned_tiling": "tiled64", "tuned_gflops": 1.0, "speedup": 2.0}]


def test_one_call_keeps_the_first_figures_and_skips_what_the_budget_leaves_no_time_for(tmp_path):
    """`all` on lavapipe at tiny sizes with a 45 s budget and steps of at least 30 s: the first training figure is
    measured and written, and the budget is spent before the GPU tests (the last step), which say so.

    Each measured step goes through an interpreter that first waits 2 s, so the budget runs out by the GPU tests
    however fast the machine is (a fast CI box once ran all nine steps in 13 s, inside the budget)."""
    import time

    slow_python = tmp_path / "slow_python"
    slow_python.write_text(f'#!/bin/bash\ncase "$1" in tools/gpu_report.py|-c) ;; *) sleep 2;; esac\n'
                           f'exec {sys.executable} "$@"\n')
    slow_python.chmod(0o755)
    out = tmp_path / "report"
    env = {**os.environ, "HELIOS_REPORT_SETUP": "0", "GPU_REPORT_QUICK": "1", "GPU_REPORT_BUDGET_S": "45",
           "GPU_REPORT_MIN_STEP_S": "30", "PYTHON": str(slow_python)}
    env.pop("OUT", None)
    t0 = time.monotonic()
    res = subprocess.run(["bash", str(SCRIPT), "all", str(out)], capture_output=True, text=True, env=env,
                         timeout=120)
    seconds = time.monotonic() - t0
    assert res.returncode == 3, res.stdout[-2000:] + res.stderr[-2000:]  # 3: the budget skipped or cut steps
    assert seconds < 55

    def step_records(name):
        return [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]

    train = step_records("train_bf16")
    assert train[-1]["status"] == "ok"
    figures = [r for r in train if r.get("event") == "bench_train"]
    assert figures and figures[0]["dtype"] == "bf16" and figures[0]["tok_s"] > 0
    index = (out / "index.txt").read_text()
    plan = next(line for line in index.splitlines() if line.startswith("plan: ")).split()[1:]
    assert plan[:2] == ["info", "train_bf16"] and plan[-1] == "gpu_tests"
    statuses = {name: step_records(name)[-1]["status"] for name in plan}
    assert set(statuses.values()) <= {"ok", "cut", "skipped"}, statuses
    assert statuses["gpu_tests"] == "skipped" and "gpu_tests: skipped, budget spent" in index
    assert not (out / "gpu_tests.log").exists()
    report = json.loads((out / "report.json").read_text())
    assert [s["step"] for s in report["steps"]] == plan
    assert "| gpu_tests | skipped |" in (out / "report.md").read_text()
