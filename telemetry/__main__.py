"""`python -m telemetry {watch,plot,summary,csv,serve} RUN_DIR`: read a run's metrics.jsonl (the CLI layer prints).

Bad input (a missing or mistyped run, a file that is not a helios metrics log, a plot path that cannot be written)
ends in one `telemetry: error: ...` line and exit code 2.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import warnings
from pathlib import Path

from telemetry.events import NotTelemetryError, check_telemetry, metrics_path, read_events, surviving, trainer_alive


class UsageError(Exception):
    """Bad input: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree for the five commands."""
    parser = argparse.ArgumentParser(prog="python -m telemetry", description="inspect a helios run's metrics.jsonl")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    w = sub.add_parser("watch", help="live terminal dashboard of a run",
                       description="Live dashboard: loss/lr/grad-norm sparklines, throughput, memory, recent events. "
                       "When stdout is not a terminal (or with --plain) it prints one line per event instead and "
                       "exits when the run ends.")
    w.add_argument("run_dir", metavar="RUN_DIR", type=Path)
    w.add_argument("--once", action="store_true", help="render the current state once and exit")
    w.add_argument("--plain", action="store_true", help="one plain line per event (the default when not a TTY)")
    w.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    w.add_argument("--wait", type=float, default=60.0, metavar="S",
                   help="seconds to wait for a run directory that does not exist yet (default 60)")
    p = sub.add_parser("plot", help="write a PNG of the run's curves",
                       description="Train/val loss, lr, grad norm with clip/skip marks, tok/s, memory, step time.")
    p.add_argument("run_dir", metavar="RUN_DIR", type=Path)
    p.add_argument("-o", "--output", type=Path, default=None, help="PNG path (default RUN_DIR/metrics.png)")
    s = sub.add_parser("summary", help="short table of a run's headline numbers")
    s.add_argument("run_dir", metavar="RUN_DIR", type=Path)
    s.add_argument("--json", action="store_true", help="print one JSON object")
    c = sub.add_parser("csv", help="write the run's steps and evals as a CSV table (for spreadsheets)",
                       description="One row per step (step, t, loss, lr, grad_norm, clip_coef, skipped, tok_per_s, "
                       "step_ms, mfu, val_loss; val_loss on the steps an eval followed), converted from "
                       "metrics.jsonl; steps replayed after a resume appear once.")
    c.add_argument("run_dir", metavar="RUN_DIR", type=Path)
    c.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="CSV path (default RUN_DIR/metrics.csv; - for stdout)")
    v = sub.add_parser("serve", help="live dashboard in the browser (one or more runs overlaid)",
                       description="Serve a live web dashboard of the runs (charts update as they train). Binds "
                       "127.0.0.1 unless --host says otherwise and prints the URL.")
    v.add_argument("run_dirs", metavar="RUN_DIR", type=Path, nargs="+")
    v.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    v.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    return parser


def _check_log(path: Path) -> None:
    """UsageError unless path is a helios metrics log."""
    if not path.is_file():
        raise UsageError(f"no metrics log at {path}")
    try:
        check_telemetry(path)
    except NotTelemetryError as exc:
        raise UsageError(str(exc)) from None


def _plot(args: argparse.Namespace, events: list[dict], path: Path) -> int:
    from telemetry.plot import plot_run

    out = args.output or path.parent / "metrics.png"
    if out.suffix.lower() != ".png":
        raise UsageError(f"-o {out}: plot writes a PNG image; give a path ending in .png")
    try:
        plot_run(events, out, title=str(args.run_dir))
    except OSError as exc:
        blocker = next((p for p in [out.parent, *out.parent.parents] if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            reason = f"{blocker} is a file, not a folder"
        else:
            reason = exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))
        raise UsageError(f"cannot write {out}: {reason}; choose a writable path with -o") from None
    print(out)
    return 0


def _csv(args: argparse.Namespace, events: list[dict], path: Path) -> int:
    from telemetry.csv_table import write_csv

    if args.output == "-":
        write_csv(events, sys.stdout)
        return 0
    out = Path(args.output) if args.output else path.parent / "metrics.csv"
    try:
        with open(out, "w", encoding="utf-8", newline="") as f:
            count = write_csv(events, f)
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc.strerror or exc}; choose a writable path with -o") from None
    print(f"{out} ({count} rows)")
    return 0


def _watch(args: argparse.Namespace) -> int:
    from telemetry.watch import wait_for_run, watch, watch_plain

    if args.interval <= 0 or args.wait < 0:
        raise UsageError("--interval must be positive and --wait zero or more")
    problem = wait_for_run(args.run_dir, 0 if args.once else args.wait)
    if problem:
        raise UsageError(problem)
    log = metrics_path(args.run_dir)
    if log.is_file():
        _check_log(log)
    if args.plain or (not args.once and not sys.stdout.isatty()):
        return watch_plain(args.run_dir, interval=args.interval)
    else:
        watch(args.run_dir, once=args.once, interval=args.interval)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from telemetry.serve import start

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: expected 0-65535 (0 picks a free port)")
    server = None
    try:  # one try from the bind on: a Ctrl-C just after the URL line is printed ends quietly too
        try:
            server = start(args.run_dirs, args.host, args.port)
        except ValueError as exc:  # NotTelemetryError included
            raise UsageError(str(exc)) from None
        except OSError as exc:
            raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}; "
                             "pick another --host or --port (0 picks a free port)") from None
        server.serve_forever(poll_interval=0.25)
    except KeyboardInterrupt:
        pass
    finally:
        if server is not None:
            server.server_close()
    return 0


def run(args: argparse.Namespace) -> int:
    """Dispatch a parsed command; raises UsageError for bad input."""
    if args.command == "watch":
        return _watch(args)
    if args.command == "serve":
        return _serve(args)
    path = metrics_path(args.run_dir)
    _check_log(path)
    events = surviving(read_events(path))  # steps replayed after a resume: the later copy counts
    if args.command == "plot":
        return _plot(args, events, path)
    if args.command == "csv":
        return _csv(args, events, path)
    from telemetry.summary import format_summary, summarize

    summary = summarize(events, trainer_alive(path.parent))
    print(json.dumps(summary) if args.json else format_summary(summary))
    return 0


MAX_WARNINGS = 10


def _short_warnings():
    """Malformed lines become one short stderr line each (not a Python warning with a source excerpt), and at
    most MAX_WARNINGS of them: a log with many torn lines should not bury the output."""
    shown = 0

    def show(message: object, *_args: object, **_kwargs: object) -> None:
        nonlocal shown
        shown += 1
        if shown <= MAX_WARNINGS:
            print(f"telemetry: warning: {message}", file=sys.stderr)
        elif shown == MAX_WARNINGS + 1:
            print("telemetry: warning: more malformed lines skipped without a warning each", file=sys.stderr)

    return show


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (2 for bad input, after one error line)."""
    args = build_parser().parse_args(argv)
    warnings.showwarning = _short_warnings()
    try:
        return run(args)
    except UsageError as exc:
        print(f"telemetry: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # stdout's reader went away (`... | head`): say nothing more, and keep Python's exit-time flush from
        # reporting the closed pipe (as trainer.cli does).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
