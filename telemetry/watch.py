"""`python -m telemetry watch RUN_DIR`: a live terminal dashboard of a run (rich), fed by tailing metrics.jsonl."""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 60) -> str:
    """Unicode block sparkline of the values, bucket-averaged down to at most `width` characters."""
    vals = [v for v in values if v is not None]
    if not vals:
        return ""
    if len(vals) > width:
        size = len(vals) / width
        vals = [sum(b) / len(b) for i in range(width) if (b := vals[int(i * size):int((i + 1) * size)] or [vals[-1]])]
    lo, hi = min(vals), max(vals)
    span = (hi - lo) or 1.0
    return "".join(BLOCKS[min(len(BLOCKS) - 1, int((v - lo) / span * len(BLOCKS)))] for v in vals)


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


class Dashboard:
    """Keeps the recent history of a run and renders it as rich panels."""

    def __init__(self, run_dir: Path, history: int = 600):
        self.run_dir = run_dir
        self.config: dict[str, Any] = {}
        self.steps: deque[dict[str, Any]] = deque(maxlen=history)
        self.evals: deque[dict[str, Any]] = deque(maxlen=50)
        self.notable: deque[dict[str, Any]] = deque(maxlen=8)
        self.status = "waiting for events"
        self.first_t: float | None = None

    def update(self, events: list[dict[str, Any]]) -> None:
        """Fold new events into the state."""
        for e in events:
            ev = e["event"]
            self.first_t = self.first_t or e.get("t")
            if ev == "config":
                self.config, self.status = e, "running"
            elif ev == "step":
                self.steps.append(e)
                self.status = "running"
            else:
                if ev == "eval":
                    self.evals.append(e)
                if ev == "end":
                    self.status = e.get("status", "ended")
                self.notable.append(e)

    def render(self) -> Any:
        """A rich renderable of the whole dashboard."""
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table

        s = self.steps[-1] if self.steps else {}
        total = self.config.get("max_iters")
        step = s.get("step", self.config.get("start_step", 0))
        times = [x["step_ms"] for x in list(self.steps)[-20:] if isinstance(x.get("step_ms"), (int, float))]
        eta = (total - step) * (sum(times) / len(times)) / 1000 if total and times else None
        head = Table.grid(padding=(0, 2))
        cfg = self.config
        head.add_row(f"[bold]{self.run_dir}[/]", f"{cfg.get('backend', '?')} on {cfg.get('device', '?')}",
                     f"{cfg.get('num_params', 0):,} params")
        head.add_row(f"step [bold]{step}[/] / {total or '?'}", f"status: {self.status}",
                     f"ETA {eta:.0f}s" if eta is not None else "ETA -")

        def num(key: str) -> list[float]:
            return [x[key] for x in self.steps if isinstance(x.get(key), (int, float))]

        curves = Table(show_header=False, box=None, padding=(0, 1))
        curves.add_column(style="bold", width=10)
        curves.add_column(no_wrap=True)
        curves.add_column(justify="right", width=22)
        loss, vals = num("loss"), [e["val_loss"] for e in self.evals if isinstance(e.get("val_loss"), (int, float))]
        curves.add_row("loss", sparkline(loss), f"{loss[-1]:.4f} (min {min(loss):.4f})" if loss else "-")
        curves.add_row("val loss", sparkline(vals), f"{vals[-1]:.4f} (best {min(vals):.4f})" if vals else "-")
        lr, gn = num("lr"), num("grad_norm")
        curves.add_row("lr", sparkline(lr), f"{lr[-1]:.2e}" if lr else "-")
        curves.add_row("grad norm", sparkline(gn), f"{gn[-1]:.3f}" if gn else "-")
        tps = num("tok_per_s")
        curves.add_row("tok/s", sparkline(tps), f"{tps[-1]:,.0f}" if tps else "-")
        mem = num("pool_bytes")
        curves.add_row("memory", sparkline(mem), _human_bytes(mem[-1]) if mem else "-")

        mfu = s.get("mfu")
        times_ms = "  ".join(f"{k[:-3]} {s.get(k, 0):.1f}" for k in ("fwd_ms", "bwd_ms", "opt_ms", "wait_ms", "comm_ms")
                             if k != "comm_ms" or k in s)  # comm: data-parallel runs only
        counts = "  ".join(f"{k} {s.get(k, 0)}" for k in ("dispatches", "submits", "barriers", "pool_regions",
                                                          "pool_classes", "device_allocs"))
        perf = (f"{s.get('step_ms', 0):.1f} ms/step  ({times_ms} ms)  mfu "
                f"{f'{min(mfu, 1.0):.1%}' if isinstance(mfu, (int, float)) else '-'}\n{counts}")
        log = Table(show_header=False, box=None, padding=(0, 1))
        for e in self.notable:
            log.add_row(str(e.get("step", "")), e["event"], _describe(e))
        return Group(Panel(head, title="helios run"), Panel(curves, title="curves"), Panel(perf, title="step"),
                     Panel(log, title="recent events"))


def _describe(e: dict[str, Any]) -> str:
    """One short line per notable event."""
    ev = e["event"]
    if ev == "eval":
        return f"val loss {e.get('val_loss', float('nan')):.4f}"
    if ev == "sample":
        return repr(str(e.get("text", ""))[:70])
    if ev == "ckpt":
        return f"{e.get('path')} ({e.get('reason')})"
    if ev == "skip":
        return f"{e.get('reason')} (grad norm {e.get('grad_norm')})"
    if ev == "end":
        return str(e.get("status"))
    return ""


def watch(run_dir: Path, once: bool = False, interval: float = 1.0, console: Any = None) -> None:
    """Show the dashboard until Ctrl-C (once=True: render the current state once and return)."""
    from rich.console import Console
    from rich.live import Live

    from telemetry.events import EventTail, trainer_alive

    console = console or Console()
    tail = EventTail(run_dir)
    board = Dashboard(run_dir)
    board.update(tail.poll())
    if once:
        console.print(board.render())
        return
    with Live(board.render(), console=console, refresh_per_second=4, screen=False) as live:
        try:
            while True:
                time.sleep(interval)
                board.update(tail.poll())
                if board.status in ("running", "waiting for events") and trainer_alive(run_dir) is False:
                    board.status = "crashed (its trainer is gone without an `end` event)"
                live.update(board.render())
        except KeyboardInterrupt:
            pass


def wait_for_run(run_dir: Path, wait_s: float, poll_s: float = 0.5, out: Any = None) -> str | None:
    """Wait up to wait_s for a run directory the trainer has not created yet; None when it exists.

    Returns the one-line problem to report otherwise: at once when even its parent folder is missing (a mistyped
    path, not a run about to start), else after wait_s seconds with a message printed while waiting.
    """
    if run_dir.exists():
        return None
    if not run_dir.parent.is_dir():
        return f"{run_dir}: neither the run directory nor its parent {run_dir.parent} exists; check the path"
    if wait_s > 0:
        print(f"waiting up to {wait_s:g} s for {run_dir} to appear (the trainer creates it when the run starts)",
              file=out or sys.stderr, flush=True)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
            if run_dir.exists():
                return None
    return (f"{run_dir} does not exist" + (f" (waited {wait_s:g} s)" if wait_s > 0 else "")
            + "; check the path (a run lives in out_dir/name, e.g. runs/shakespeare) or start the run first")


def plain_line(e: dict[str, Any]) -> str | None:
    """One line of text for an event in plain mode (None for events not worth a line)."""
    ev = e["event"]
    if ev == "config":
        return (f"config: {e.get('backend', '?')} on {e.get('device', '?')}, {e.get('num_params', 0):,} params, "
                f"steps {e.get('start_step', 0)}->{e.get('max_iters', '?')}")
    if ev == "step":
        def f(key: str, spec: str) -> str:
            v = e.get(key)
            return format(v, spec) if isinstance(v, (int, float)) else "-"

        return (f"step {e.get('step')} | loss {f('loss', '.4f')} | lr {f('lr', '.2e')} | grad norm "
                f"{f('grad_norm', '.3f')} | {f('tok_per_s', ',.0f')} tok/s | {f('step_ms', '.1f')} ms")
    if ev in ("eval", "sample", "ckpt", "skip", "end"):
        return f"step {e.get('step', '?')} {ev}: {_describe(e)}"
    return None


def watch_plain(run_dir: Path, interval: float = 1.0, out: Any = None, err: Any = None) -> int:
    """Print one line per event (for logs and pipes, where a live screen shows nothing) until the run's `end`
    event, its trainer's death without one, or Ctrl-C. Returns the exit code: 1 when the trainer died."""
    from telemetry.events import EventTail, trainer_alive, trainer_pid

    out, err = out or sys.stdout, err or sys.stderr
    tail = EventTail(run_dir)
    seen = False
    try:
        while True:
            ended = False
            events = tail.poll()
            for e in events:
                line = plain_line(e)
                if line is not None:
                    print(line, file=out, flush=True)
                ended = e["event"] == "end" or (ended and e["event"] != "config")
            if ended:
                return 0
            if not events and trainer_alive(run_dir) is False:
                print(f"telemetry: the run's trainer (pid {trainer_pid(run_dir)}) is gone and the log has no `end` "
                      "event: it crashed or was killed; its output says why, and `trainer run` resumes from the "
                      "latest checkpoint", file=err, flush=True)
                return 1
            if not seen and not events:
                print(f"waiting for events in {run_dir}/metrics.jsonl (the trainer writes its first once its device "
                      "and data are ready)", file=err, flush=True)
            seen = True
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `watch --plain | head`: the reader left; exit quietly, with nothing left to flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
