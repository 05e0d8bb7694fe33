"""tools/gpu_report.sh: what it runs exists, its records are tagged per step, and the report is built from them."""

import json
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
    assert steps["matmul_fp32"] == {"event": "report_step", "step": "matmul_fp32", "rc": 0, "seconds": 12.3,
                                    "last": "done 3/3"}
    assert report["figures"]["matmul_fp32"][0]["ratio"] == 0.71
    md = (tmp_path / "report.md").read_text()
    assert "NVIDIA H100" in md and "| matmul_fp32 | 0 | 12.3 |" in md and "0.71x" in md


def test_bench_tune_takes_its_family_as_an_argument_not_a_benchmark_name(tmp_path):
    """`python -m helios.bench tune matmul` (the command docs and the report run) reaches tune with its family."""
    import os

    res = subprocess.run([sys.executable, "-m", "helios.bench", "tune", "matmul", "--shapes", "8x8x8", "--layouts",
                          "nn", "--quick", "--dry-run"], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "HELIOS_CACHE_DIR": str(tmp_path)})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "nn:8x8x8 ->" in res.stdout
