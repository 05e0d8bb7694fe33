"""Console progress for `trainer run` (CLI layer): a rich progress bar on a TTY, plain periodic lines otherwise.

Both are listeners: the loop hands them every event it logs.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any


def _fmt_eta(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def describe(record: dict[str, Any]) -> str | None:
    """One human line for the non-step events (None for events not worth a line)."""
    ev = record["event"]
    if ev == "config":
        resumed = f", resumed from {record['resumed_from']}" if record.get("resumed_from") else ""
        return (f"{record['backend']} backend on {record['device']}: {record['num_params']:,} parameters, "
                f"{record['train_tokens']:,} train / {record['val_tokens']:,} val tokens, "
                f"steps {record['start_step']}->{record['max_iters']}{resumed}")
    if ev == "eval":
        return f"step {record['step']}: val loss {record['val_loss']:.4f}"
    if ev == "sample":
        return f"step {record['step']}: sample\n{record['text'].strip()}\n"
    if ev == "ckpt":
        return f"step {record['step']}: checkpoint {record['path']} ({record['reason']})"
    if ev == "skip":
        norm = record.get("grad_norm")
        shown = "nan" if norm is None else f"{norm:.3g}"
        return f"step {record['step']}: skipped ({record['reason']}, grad norm {shown})"
    if ev == "end":
        return f"{record['status']} at step {record['step']}"
    return None


class PlainProgress:
    """A line every log_interval steps (step, loss, lr, tok/s, ETA) and one per notable event."""

    def __init__(self, log_interval: int, stream: IO[str] | None = None):
        self.log_interval = log_interval
        self.stream: IO[str] | None = stream or sys.stdout
        self.t0: float | None = None
        self.start = self.total = 0

    def __call__(self, record: dict[str, Any]) -> None:
        ev = record["event"]
        if ev == "config":
            self.start, self.total, self.t0 = record["start_step"], record["max_iters"], time.monotonic()
        if ev == "step":
            step = record["step"]
            if step % self.log_interval and step != self.total and step != self.start + 1:
                return
            done = step - self.start
            eta = (time.monotonic() - self.t0) / done * (self.total - step) if self.t0 and done else 0.0
            loss = "nan" if record["loss"] is None else f"{record['loss']:.4f}"
            line = (f"step {step}/{self.total} | loss {loss} | lr {record['lr']:.2e} | "
                    f"{record['tok_per_s']:,.0f} tok/s | {record['step_ms']:.0f} ms | ETA {_fmt_eta(eta)}")
        else:
            line = describe(record)
        if line and self.stream is not None:
            try:
                print(line, file=self.stream, flush=True)
            except (BrokenPipeError, OSError):
                self.stream = None  # a closed pipe (e.g. `| head`) must not stop the training run

    def close(self) -> None:
        """Nothing to tear down."""


class RichProgress:
    """A rich progress bar with loss, tok/s and ETA; events print above it."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tok_s]} tok/s"),
                                 TextColumn("ETA"), TimeRemainingColumn(), refresh_per_second=4)
        self.task: Any = None

    def __call__(self, record: dict[str, Any]) -> None:
        ev = record["event"]
        if ev == "config":
            self.progress.start()
            self.task = self.progress.add_task("train", total=record["max_iters"], completed=record["start_step"],
                                               loss="-", tok_s="-")
        if ev == "step" and self.task is not None:
            loss = "nan" if record["loss"] is None else f"{record['loss']:.4f}"
            self.progress.update(self.task, completed=record["step"], loss=loss, tok_s=f"{record['tok_per_s']:,.0f}")
            return
        line = describe(record)
        if line:
            self.progress.console.print(line, highlight=False, markup=False)

    def close(self) -> None:
        """Stop the live display."""
        self.progress.stop()


def make_progress(log_interval: int) -> PlainProgress | RichProgress:
    """RichProgress on an interactive terminal, PlainProgress otherwise (logs, CI, pipes)."""
    if sys.stdout.isatty():
        return RichProgress()
    return PlainProgress(log_interval)
