"""The report half of tools/gpu_report.sh: tag a step's JSON records, and build report.md + report.json.

    python tools/gpu_report.py --records STEP RC MS < output   # the step's records (one JSON per line)
    python tools/gpu_report.py --report DIR                    # DIR/*.jsonl -> DIR/report.md, DIR/report.json

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


def tag_records(step: str, rc: int, ms: int, lines) -> list[dict]:
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
    out.append({"event": "report_step", "step": step, "rc": rc, "seconds": round(ms / 1000, 1), "last": last[:300]})
    return out


def load(directory: Path) -> list[dict]:
    records = []
    for path in sorted(directory.glob("*.jsonl")):
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
             "| step | exit | seconds | last line |", "| --- | --- | --- | --- |"]
    for s in summary["steps"]:
        lines.append(f"| {s['step']} | {s['rc']} | {s['seconds']} | {s['last'].replace('|', '/')} |")
    lines += ["", "Goals: " + "; ".join(f"{k} >= {v}x" for k, v in summary["goals"].items()), ""]
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
    group.add_argument("--report", metavar="DIR", type=Path)
    args = parser.parse_args(argv)
    if args.records:
        step, rc, ms = args.records
        for rec in tag_records(step, int(rc), int(ms), sys.stdin):
            print(json.dumps(rec))
        return 0
    summary = summarise(load(args.report))
    (args.report / "report.json").write_text(json.dumps(summary, indent=1))
    (args.report / "report.md").write_text(markdown(summary))
    print(f"wrote {args.report / 'report.md'} and report.json ({len(summary['steps'])} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
