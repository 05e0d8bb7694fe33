"""Data-parallel scaling on this machine: step time, all-reduce time and efficiency at 1, 2, 4 ranks.

    python tools/bench_distributed.py configs/shakespeare.toml --ranks 1,2,4 --steps 30

Each rank count trains `--steps` steps of the config (weak scaling: every rank keeps the config's
batch_size, so N ranks process N times the tokens per step) into a scratch run directory, and the
figures come from its metrics.jsonl: the median step time and all-reduce time over the steps after the
first few (cold kernels), tokens per second, and the scaling efficiency tok/s(N) / (N x tok/s(1)).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(config: str, ranks: int, steps: int, out: Path, backend: str) -> dict:
    name = f"dp{ranks}"
    cmd = [sys.executable, "-m", "trainer", "run", config, "--backend", backend, f"--train.max_iters={steps}",
           "--train.eval_interval=0", "--train.sample_tokens=0", "--train.ckpt_interval=0",
           "--schedule.warmup_iters=0",
           f"--run.out_dir={out}", f"--run.name={name}", "--nproc", str(ranks)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{ranks} rank(s) failed: {done.stderr.strip()[-500:]}")
    events = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    warm = [e for e in events if e["event"] == "step"][3:]
    step_ms = statistics.median(e["step_ms"] for e in warm)
    reduce_ms = statistics.median(e.get("allreduce_ms", 0.0) for e in warm)
    return {"ranks": ranks, "step_ms": step_ms, "allreduce_ms": reduce_ms,
            "tok_s": statistics.median(e["tok_per_s"] for e in warm)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="configs/shakespeare.toml")
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--backend", default="helios", choices=["helios", "torch"])
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(args.config, int(n), args.steps, Path(tmp), args.backend) for n in args.ranks.split(",")]
    base = next((r for r in rows if r["ranks"] == 1), None)
    print(f"{'ranks':>5} {'step ms':>8} {'allreduce ms':>12} {'share':>6} {'tok/s':>8} {'efficiency':>10}")
    for r in rows:
        eff = r["tok_s"] / (r["ranks"] * base["tok_s"]) if base else float("nan")
        share = r["allreduce_ms"] / r["step_ms"]
        print(f"{r['ranks']:>5} {r['step_ms']:>8.1f} {r['allreduce_ms']:>12.2f} {share:>6.1%} {r['tok_s']:>8,.0f} "
              f"{eff:>10.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
