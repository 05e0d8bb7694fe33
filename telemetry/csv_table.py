"""A run's steps and evals as one CSV table, for spreadsheets (`python -m telemetry csv RUN_DIR`)."""

from __future__ import annotations

import csv
from typing import IO, Any

COLUMNS = ("step", "t", "loss", "lr", "grad_norm", "clip_coef", "skipped", "tok_per_s", "step_ms", "mfu", "val_loss")


def rows(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per step, in step order, with the val loss on the steps an eval followed (events as `surviving`
    gives them: a step replayed after a resume appears once)."""
    by_step: dict[int, dict[str, Any]] = {}
    for e in events:
        step = e.get("step")
        if not isinstance(step, int):
            continue
        if e["event"] == "step":
            by_step[step] = {k: e.get(k) for k in COLUMNS if k != "val_loss"} | {
                "val_loss": by_step.get(step, {}).get("val_loss")}
        elif e["event"] == "eval":
            by_step.setdefault(step, {"step": step})["val_loss"] = e.get("val_loss")
    return [by_step[s] for s in sorted(by_step)]


def write_csv(events: list[dict[str, Any]], out: IO[str]) -> int:
    """Write the table (one header line, then the rows; empty cells where a value is absent); returns the rows."""
    table = rows(events)
    writer = csv.DictWriter(out, fieldnames=COLUMNS, restval="", lineterminator="\n")
    writer.writeheader()
    for row in table:
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return len(table)
