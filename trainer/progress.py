"""Console progress for `trainer run` (CLI layer): a rich progress bar on a TTY, plain periodic lines otherwise.

Both are listeners: the loop hands them every event it logs.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from telemetry.summary import finite_number


def fmt_num(value: Any, spec: str) -> str:
    """A number formatted by spec; "nan" for None (the log's form of NaN/Inf), NaN or Inf, never a TypeError."""
    if not finite_number(value):
        return "nan"
    return format(value, spec)


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
        dtype = f"{record['dtype']} ({record['dtype_reason']}), " if record.get("dtype") else ""
        return (f"{record['backend']} backend on {record['device']}: {record['num_params']:,} parameters, {dtype}"
                f"{record['train_tokens']:,} train / {record['val_tokens']:,} val tokens, "
                f"steps {record['start_step']}->{record['max_iters']}{resumed}"
                + (f"\nMFU peak: {record['peak_source']}" if record.get("peak_source") else ""))
    if ev == "eval":
        return f"step {record['step']}: val loss {fmt_num(record.get('val_loss'), '.4f')}"
    if ev == "sample":
        return f"step {record['step']}: sample\n{record['text'].strip()}\n"
    if ev == "ckpt":
        return f"step {record['step']}: checkpoint {record['path']} ({record['reason']})"
    if ev == "skip":
        norm = fmt_num(record.get("grad_norm"), ".3g")
        return f"step {record['step']}: skipped ({record['reason']}, grad norm {norm})"
    if ev == "end":
        return f"{record['status']} at step {record['step']}"
    if ev == "tune":
        if record["status"] == "skipped":
            return f"tune: skipped, {record['reason']}"
        if record["status"] != "tuned":
            return (f"tune: {record['already_stored']} shapes already tuned on this device, nothing to do"
                    if record["status"] == "stored" else f"tune: nothing tuned (budget {record['budget_s']:g} s)")
        changes = record["changes"]
        return (f"tune: {record['tuned']} shapes of {', '.join(record['families'])} in {record['seconds']:.0f} s "
                f"(budget {record['budget_s']:g} s), {len(changes)} changed from the table"
                + (": " + "; ".join(changes) if changes else "")
                + (f"; {record['skipped']} left by the budget" if record["skipped"] else ""))
    if ev == "peak":
        was, now = (record.get(k) for k in ("was", "peak_flops"))
        return (f"step {record['step']}: MFU passed 100% of the device peak ({fmt_num(was and was / 1e9, ',.1f')} "
                f"GFLOP/s); now {fmt_num(now and now / 1e9, ',.1f')} GFLOP/s: {record['peak_source']}")
    return None


def mfu_text(record: dict[str, Any]) -> str:
    """MFU as a percentage, never above 100% (the loop caps it; older logs may not), or "" when unknown."""
    mfu = record.get("mfu")
    return f"MFU {min(float(mfu), 1.0):.1%}" if fmt_num(mfu, "g") != "nan" else ""


def step_line(record: dict[str, Any], total: int, eta: str) -> str:
    """The periodic log line of a step: step, loss, lr, tok/s, MFU, step time, ETA."""
    mfu = f" | {mfu_text(record)}" if mfu_text(record) else ""
    return (f"step {record['step']}/{total} | loss {fmt_num(record.get('loss'), '.4f')} | "
            f"lr {fmt_num(record.get('lr'), '.2e')} | {fmt_num(record.get('tok_per_s'), ',.0f')} tok/s{mfu} | "
            f"{fmt_num(record.get('step_ms'), '.0f')} ms | ETA {eta}")


def logged(step: int, log_interval: int, start: int, total: int) -> bool:
    """Whether a step gets a log line: every log_interval-th, the first of this process and the last."""
    return step % log_interval == 0 or step == total or step == start + 1


class BudgetWatch:
    """HELIOS_MEMORY_BUDGET_MB is soft: past it the device pool first waits for in-flight memory and gives back
    unused blocks, but grows when a step needs more. The first step that finds the pool past the budget gets
    one line saying so and what the run needs."""

    def __init__(self) -> None:
        from helios.env import memory_budget_mb

        self.budget_mb = memory_budget_mb()  # validated already: the runtime read it at start-up
        self.told = False

    def check(self, record: dict[str, Any]) -> str | None:
        """The warning for a step event whose pool_bytes passed the budget (once per run), else None."""
        reserved = record.get("pool_bytes")
        if self.told or self.budget_mb is None or not isinstance(reserved, int) or reserved <= self.budget_mb << 20:
            return None
        self.told = True
        need = -(-reserved // (1 << 20))
        return (f"warning: the device pool reserves {need} MiB at step {record['step']}, past "
                f"HELIOS_MEMORY_BUDGET_MB={self.budget_mb}: the budget is soft (the pool waits for memory in flight "
                f"before growing, but grows when a step needs more); this run needs at least {need} MiB, so set the "
                "budget to that or more, or train a smaller batch or model")


class ClipWatch:
    """One warning when more than telemetry.summary.CLIP_WARN_RATE of the steps after warmup clip their gradient:
    judged once CLIP_WINDOW of them have run (or all this process will run, if fewer), and on every step after,
    until it warns."""

    CLIP_WINDOW = 100

    def __init__(self) -> None:
        self.warmup, self.window = 0, 0
        self.clipped = self.counted = 0
        self.told = False

    def start(self, config: dict[str, Any]) -> None:
        """A `config` event: this process's warmup and how many steps after it it will run."""
        from telemetry.summary import warmup_of

        self.warmup = warmup_of(config)
        ahead = config["max_iters"] - max(config["start_step"], self.warmup)
        self.window = min(self.CLIP_WINDOW, ahead)

    def check(self, record: dict[str, Any]) -> str | None:
        """The warning for a step event that brings the clip rate past the threshold (once per run), else None."""
        from telemetry.summary import clip_warning, clips

        clip = clips(record)
        if self.told or record["step"] <= self.warmup or clip is None:
            return None
        self.counted += 1
        self.clipped += clip
        if self.counted < self.window:
            return None
        line = clip_warning(self.clipped, self.counted)
        self.told = line is not None
        return line


class StepClock:
    """The ETA from the steps after the first: the first step of a process compiles kernels (seconds to
    minutes on a cold cache) and would make the estimate absurd."""

    def __init__(self) -> None:
        self.first_done: float | None = None
        self.first_step = 0

    def eta(self, step: int, total: int) -> str:
        """The ETA as text: "-" until a warm step has been timed."""
        now = time.monotonic()
        if self.first_done is None:
            self.first_done, self.first_step = now, step
        warm = step - self.first_step
        if step >= total:
            return _fmt_eta(0)
        return _fmt_eta((now - self.first_done) / warm * (total - step)) if warm else "-"


class PlainProgress:
    """A line every log_interval steps (step, loss, lr, tok/s, ETA) and one per notable event."""

    def __init__(self, log_interval: int, stream: IO[str] | None = None):
        self.log_interval = log_interval
        self.stream: IO[str] | None = stream or sys.stdout
        self.clock = StepClock()
        self.start = self.total = 0
        self.compiled, self.compile_ms = 0, 0.0
        self.budget = BudgetWatch()
        self.clip = ClipWatch()

    def compiling(self, kernel: str, count: int, ms: float) -> None:
        """A new kernel pipeline was built: a line every 10th once compiling has taken a second (a cold
        start's progress; a warm start builds its pipelines from the caches in well under that)."""
        self.compiled += 1
        self.compile_ms += ms
        if self.compiled % 10 == 0 and self.compile_ms >= 1000:
            self._print(f"compiling kernels: {self.compiled} so far, {self.compile_ms / 1000:.0f} s "
                        f"(now {kernel}); the driver caches them for later runs")

    def __call__(self, record: dict[str, Any]) -> None:
        ev = record["event"]
        if ev == "config":
            self.start, self.total = record["start_step"], record["max_iters"]
            self.clip.start(record)
        if ev == "step":
            step = record["step"]
            self._print(self.budget.check(record))
            self._print(self.clip.check(record))
            eta = self.clock.eta(step, self.total)
            if not logged(step, self.log_interval, self.start, self.total):
                return
            line = step_line(record, self.total, eta)
        else:
            line = describe(record)
        self._print(line)

    def _print(self, line: str | None) -> None:
        if line and self.stream is not None:
            try:
                print(line, file=self.stream, flush=True)
            except (BrokenPipeError, OSError):
                self.stream = None  # a closed pipe (e.g. `| head`) must not stop the training run

    def close(self) -> None:
        """Nothing to tear down."""

    def say(self, line: str) -> None:
        """A line now (signal acknowledgements)."""
        self._print(line)


class RichProgress:
    """A rich progress bar with loss, tok/s and ETA; events, and a step line every log_interval steps (the
    scrolling log nanoGPT users expect), print above it and stay in the scrollback."""

    def __init__(self, log_interval: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tok_s]} tok/s"),
                                 TextColumn("ETA {task.fields[eta]}"), TextColumn("{task.fields[status]}"),
                                 refresh_per_second=4)
        self.log_interval = log_interval
        self.task: Any = None
        self.clock = StepClock()
        self.compiled = 0
        self.start = self.total = 0
        self.budget = BudgetWatch()
        self.clip = ClipWatch()

    def compiling(self, kernel: str, count: int, ms: float) -> None:
        """Show the kernel being compiled in the bar (a cold start compiles dozens before step 1 ends)."""
        self.compiled += 1
        if self.task is not None:
            self.progress.update(self.task, status=f"compiling kernels: {self.compiled} ({kernel})")

    def __call__(self, record: dict[str, Any]) -> None:
        ev = record["event"]
        if ev == "config":
            self.start, self.total = record["start_step"], record["max_iters"]
            self.clip.start(record)
            self.progress.start()
            self.task = self.progress.add_task("train", total=self.total, completed=self.start,
                                               loss="-", tok_s="-", eta="-", status="")
        if ev == "step" and self.task is not None:
            step = record["step"]
            loss = fmt_num(record.get("loss"), ".4f")
            eta = self.clock.eta(step, self.total)
            self.progress.update(self.task, completed=step, loss=loss, tok_s=fmt_num(record.get("tok_per_s"), ",.0f"),
                                 eta=eta, status=mfu_text(record))
            if logged(step, self.log_interval, self.start, self.total):
                self.say(step_line(record, self.total, eta))
            for note in (self.budget.check(record), self.clip.check(record)):
                if note:
                    self.say(note)
            return
        line = describe(record)
        if line:
            self.say(line)

    def close(self) -> None:
        """Stop the live display (its last frame shows the last step)."""
        self.progress.refresh()
        self.progress.stop()

    def say(self, line: str) -> None:
        """A line above the bar. The bar is redrawn first: it redraws 4 times a second, so a checkpoint line
        would otherwise sit above a bar still showing the step before."""
        self.progress.refresh()
        self.progress.console.print(line, highlight=False, markup=False)


def make_progress(log_interval: int) -> PlainProgress | RichProgress:
    """RichProgress on an interactive terminal, PlainProgress otherwise (logs, CI, pipes)."""
    if sys.stdout.isatty():
        return RichProgress(log_interval)
    return PlainProgress(log_interval)
