"""`python -m telemetry {watch,plot,summary} RUN_DIR`: read a run's metrics.jsonl (the CLI layer prints)."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from telemetry.events import metrics_path, read_events, surviving


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree for the three commands."""
    parser = argparse.ArgumentParser(prog="python -m telemetry", description="inspect a helios run's metrics.jsonl")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    w = sub.add_parser("watch", help="live terminal dashboard of a run",
                       description="Live dashboard: loss/lr/grad-norm sparklines, throughput, memory, recent events.")
    w.add_argument("run_dir", metavar="RUN_DIR", type=Path)
    w.add_argument("--once", action="store_true", help="render the current state once and exit")
    w.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    p = sub.add_parser("plot", help="write a PNG of the run's curves",
                       description="Train/val loss, lr, grad norm with clip/skip marks, tok/s, memory, step time.")
    p.add_argument("run_dir", metavar="RUN_DIR", type=Path)
    p.add_argument("-o", "--output", type=Path, default=None, help="PNG path (default RUN_DIR/metrics.png)")
    s = sub.add_parser("summary", help="short table of a run's headline numbers")
    s.add_argument("run_dir", metavar="RUN_DIR", type=Path)
    s.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (2 when the run has no metrics log)."""
    args = build_parser().parse_args(argv)
    # Malformed lines become one short stderr line each, not a Python warning with a source excerpt.
    warnings.showwarning = lambda msg, *a, **k: print(f"telemetry: warning: {msg}", file=sys.stderr)
    path = metrics_path(args.run_dir)
    if not path.is_file() and args.command != "watch":
        print(f"telemetry: error: no metrics log at {path}", file=sys.stderr)
        return 2
    if args.command == "watch":
        from telemetry.watch import watch

        watch(args.run_dir, once=args.once, interval=args.interval)
        return 0
    events = surviving(read_events(path))  # steps replayed after a resume: the later copy counts
    if args.command == "plot":
        from telemetry.plot import plot_run

        out = plot_run(events, args.output or path.parent / "metrics.png", title=str(args.run_dir))
        print(out)
        return 0
    from telemetry.summary import format_summary, summarize

    summary = summarize(events)
    print(json.dumps(summary) if args.json else format_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
