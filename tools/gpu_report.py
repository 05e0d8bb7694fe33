"""The report half of tools/gpu_report.sh: tag a step's JSON records, and build report.md + report.json.

    python tools/gpu_report.py --records STEP RC MS [--limit S] < output  # the step's records, one JSON a line
    python tools/gpu_report.py --skipped STEP REASON                      # a step the budget left out
    python -m helios.bench tune matmul --json | python tools/gpu_report.py --tune-vs-table
    python tools/gpu_report.py --report DIR                  # DIR/*.jsonl -> DIR/report.md, DIR/report.json

The report puts each figure docs/GPU.md owes beside its goal, as a ratio measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Figures owed and their goals (issue: the matrix units in training; docs/GPU.md).
GOALS = {
    "matmul fp32 vs torch (TF32 off)": 0.8,
    "matmul fp16/bf16 vs torch": 0.6,
    "attention fwd+bwd vs SDPA": 0.5,
    "alpha-8l bf16 tok/s vs torch eager fp32": 1.0,
}


def status(rc: int) -> str:
    """What a step's exit code says: `timeout` exits 124 (TERM) or 137 (KILL) when the budget cut the step."""
    return "ok" if rc == 0 else "cut" if rc in (124, 137) else "failed"


def tag_records(step: str, rc: int, ms: int, lines, limit_s: int | None = None) -> list[dict]:
    """Every JSON object line of a step's output tagged with the step, then the step's own record."""
    out, last = [], ""
    for line in lines:
        text = line.strip()
        if text:
            last = text
        if text.startswith("{"):
            try:
                record = json.loads(text)
            except ValueError:
                continue
            if isinstance(record, dict):
                out.append({"step": step, **record})
    out.append({"event": "report_step", "step": step, "status": status(rc), "rc": rc, "seconds": round(ms / 1000, 1),
                "limit_s": limit_s, "last": last[:300]})
    return out


def skipped(step: str, reason: str) -> dict:
    """The record of a step the time budget left out."""
    return {"event": "report_step", "step": step, "status": "skipped", "rc": None, "seconds": 0, "limit_s": 0,
            "last": f"skipped: {reason}"}


def tune_vs_table(records: list[dict], table_tiling) -> list[dict]:
    """Per tuned shape, the winner's figure beside the figure of the tiling the table picks without tuning;
    table_tiling(M, N) names that tiling."""
    shapes: dict[tuple, list[dict]] = {}
    for r in records:
        if "tiling" in r and "winner" in r:
            shapes.setdefault((r["kernel"], r["shape"]), []).append(r)
    out = []
    for (kernel, shape), recs in shapes.items():
        M, N, _ = (int(x) for x in shape.split("x")[:3])
        tuned = next(r for r in recs if r["winner"])
        table = next((r for r in recs if r["tiling"] == table_tiling(M, N)), None)
        out.append({"event": "tune_vs_table", "kernel": kernel, "shape": shape,
                    "table_tiling": table_tiling(M, N), "table_gflops": table and table.get("gflops"),
                    "tuned_tiling": tuned["tiling"], "tuned_gflops": tuned.get("gflops"),
                    "speedup": round(table["ms"] / tuned["ms"], 3) if table and tuned["ms"] else None})
    return out


def _pass_through_tune(lines) -> list[dict]:
    """Echo the tuner's output as it comes (so a cut step keeps it), and return its JSON records."""
    records = []
    for line in lines:
        print(line, end="", flush=True)
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def load(directory: Path) -> list[dict]:
    """Every record of DIR/*.jsonl, the files in the order they were written (the order the steps ran)."""
    records = []
    for path in sorted(directory.glob("*.jsonl"), key=lambda p: (p.stat().st_mtime_ns, p.name)):
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def _ratio(rec: dict) -> float | None:
    for key in ("ratio", "vs_torch", "ratio_vs_torch", "speedup", "ratio_vs_torch_fp32"):
        value = rec.get(key)
        if isinstance(value, int | float):
            return float(value)
    return None


def summarise(records: list[dict]) -> dict:
    """The report's content: steps with exit codes, the device, and each benchmark record grouped by step."""
    steps = [r for r in records if r.get("event") == "report_step"]
    device = next((r for r in records if r.get("step") == "info" and "name" in r), None)
    figures: dict[str, list[dict]] = {}
    for r in records:
        if r.get("event") != "report_step" and r.get("step") != "info":
            figures.setdefault(r["step"], []).append(r)
    return {"device": device, "steps": steps, "figures": figures, "goals": GOALS}


def markdown(summary: dict) -> str:
    dev = summary["device"] or {}
    lines = ["# helios GPU report", "",
             f"Device: {dev.get('name', '?')} ({dev.get('device_type', '?')}), driver {dev.get('driver_name', '?')} "
             f"{dev.get('driver_info', '')}, API {dev.get('api_version', '?')}, "
             f"subgroup {dev.get('subgroup_size', '?')}, "
             f"matrix units: {dev.get('cooperative_matrix') or 'none'}", "",
             "| step | status | exit | seconds | limit | last line |", "| --- | --- | --- | --- | --- | --- |"]
    for s in summary["steps"]:
        rc = "-" if s.get("rc") is None else s["rc"]
        lines.append(f"| {s['step']} | {s.get('status', '')} | {rc} | {s['seconds']} | {s.get('limit_s') or '-'} | "
                     f"{s['last'][:120].replace('|', '/')} |")
    lines += ["", "Goals: " + "; ".join(f"{k} >= {v}x" for k, v in summary["goals"].items()), ""]
    tuned = [r for recs in summary["figures"].values() for r in recs if r.get("event") == "tune_vs_table"]
    if tuned:
        lines += ["## matmul tuned vs the table's tiling", "",
                  "| kernel | shape | table tiling | GFLOPS | tuned tiling | GFLOPS | tuned / table |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in tuned:
            gf = [f"{g:.1f}" if isinstance(g, int | float) else "-" for g in (r["table_gflops"], r["tuned_gflops"])]
            speedup = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
            lines.append(f"| {r['kernel']} | {r['shape']} | {r['table_tiling']} | {gf[0]} | {r['tuned_tiling']} | "
                         f"{gf[1]} | {speedup} |")
        lines.append("")
    for step, recs in summary["figures"].items():
        lines += [f"## {step}", "", "| record | ratio |", "| --- | --- |"]
        for r in recs:
            shown = {k: v for k, v in r.items() if k not in ("step", "event") and not isinstance(v, dict | list)}
            ratio = _ratio(r)
            lines.append(f"| {json.dumps(shown)[:400]} | {'' if ratio is None else f'{ratio:.2f}x'} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--records", nargs=3, metavar=("STEP", "RC", "MS"))
    group.add_argument("--skipped", nargs=2, metavar=("STEP", "REASON"))
    group.add_argument("--tune-vs-table", action="store_true", help="echo the tuner's output, then compare")
    group.add_argument("--report", metavar="DIR", type=Path)
    parser.add_argument("--limit", type=int, help="with --records: the step's time limit in seconds")
    args = parser.parse_args(argv)
    if args.records:
        step, rc, ms = args.records
        for rec in tag_records(step, int(rc), int(ms), sys.stdin, args.limit):
            print(json.dumps(rec))
        return 0
    if args.skipped:
        print(json.dumps(skipped(*args.skipped)))
        return 0
    if args.tune_vs_table:
        records = _pass_through_tune(sys.stdin)
        if records:  # the device is opened only now, after the tuner has finished with it
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
            from helios.device import get_device
            from helios.kernels.matmul import select as sel

            info = get_device().info
            for rec in tune_vs_table(records, lambda M, N: sel.table_choice(info, M, N, 1)):
                print(json.dumps(rec))
        return 0
    summary = summarise(load(args.report))
    (args.report / "report.json").write_text(json.dumps(summary, indent=1))
    (args.report / "report.md").write_text(markdown(summary))
    print(f"wrote {args.report / 'report.md'} and report.json ({len(summary['steps'])} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
