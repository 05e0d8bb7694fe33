"""A run's headline numbers from its events (`python -m telemetry summary RUN_DIR`)."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Any

from telemetry.events import run_status


def finite_number(value: Any) -> bool:
    """Whether a logged value is a finite real number (not None, a bool, NaN or Inf): what the log's readers show."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _num(values: list[Any]) -> list[float]:
    """The finite numbers among values (a NaN loss is logged as null; a log from elsewhere may hold NaN)."""
    return [float(v) for v in values if finite_number(v)]


def training_seconds(events: list[dict[str, Any]]) -> float:
    """Wall time spent training: each process's segment, from its `config` event to its last event, summed
    (the gaps between a run's processes, when nothing trained, are left out)."""
    total, start, last = 0.0, None, None
    for e in events:
        t = e.get("t")
        if not isinstance(t, (int, float)):
            continue
        if e["event"] == "config":
            total += (last - start) if start is not None else 0.0
            start = t
        last = t
    return total + ((last - start) if start is not None else 0.0)


CLIP_WARN_RATE = 0.2  # past this share of the steps after warmup, clipping is the run's normal, not a guard


def warmup_of(config_event: dict[str, Any]) -> int:
    """The warmup steps of the run a `config` event starts: schedule.warmup_iters, never past lr_decay_iters
    (trainer.schedule.warmup_steps, from the logged config)."""
    sched = (config_event.get("config") or {}).get("schedule") or {}
    warmup, decay = sched.get("warmup_iters") or 0, sched.get("lr_decay_iters")
    return min(warmup, decay) if isinstance(decay, int) else warmup


def clips(step_event: dict[str, Any]) -> bool | None:
    """Whether a step's gradient was clipped (clip_coef < 1); None when the step logged no clip_coef."""
    coef = step_event.get("clip_coef")
    if not finite_number(coef):
        return None
    return coef < 1


def clip_warning(clipped: int, counted: int) -> str | None:
    """One line when more than CLIP_WARN_RATE of `counted` steps after warmup clipped (else None)."""
    if not counted or clipped / counted <= CLIP_WARN_RATE:
        return None
    return (f"warning: {clipped:,} of {counted:,} steps after warmup ({clipped / counted:.0%}) clipped their "
            "gradient norm to optim.grad_clip; that many usually means a learning rate too high for the batch, or a "
            "batch too small: try a lower optim.lr or a larger train.batch_size")


def clip_rate(events: list[dict[str, Any]]) -> tuple[int, int]:
    """(steps clipped, steps with a clip_coef) after warmup, each process's warmup from its own `config` event."""
    clipped = counted = 0
    warmup = 0
    for e in events:
        if e["event"] == "config":
            warmup = warmup_of(e)
        elif e["event"] == "step" and isinstance(e.get("step"), int) and e["step"] > warmup:
            clip = clips(e)
            if clip is not None:
                counted += 1
                clipped += clip
    return clipped, counted


def summarize(events: list[dict[str, Any]], alive: bool | None = None) -> dict[str, Any]:
    """Headline numbers: progress, losses, throughput, skips, checkpoints, wall time (None where unknown).
    `alive`: whether the run's trainer process still exists (telemetry.events.trainer_alive), for the status."""
    configs = [e for e in events if e["event"] == "config"]
    steps = [e for e in events if e["event"] == "step"]
    evals = [e for e in events if e["event"] == "eval"]
    ckpts = [e for e in events if e["event"] == "ckpt"]
    last_cfg = configs[-1] if configs else {}
    losses = _num([s.get("loss") for s in steps])
    tail = losses[-10:]
    speeds = _num([s.get("tok_per_s") for s in steps[1:]]) or _num([s.get("tok_per_s") for s in steps])
    vals = _num([e.get("val_loss") for e in evals])
    clipped = sum(1 for s in steps if isinstance(s.get("clip_coef"), (int, float)) and s["clip_coef"] < 1)
    late_clipped, late_steps = clip_rate(events)
    mfus = _num([s.get("mfu") for s in steps])
    # The peak MFU divides by: the last run's, or the figure it re-measured when MFU passed 100%.
    peak_event = next((e for e in reversed(events) if e["event"] in ("peak", "config") and e.get("peak_flops")), {})
    peaks = _num([s.get("pool_peak_in_use") for s in steps])  # each step's peak, from the device pool
    reserved = _num([s.get("pool_bytes") for s in steps])
    return {
        "backend": last_cfg.get("backend"),
        "device": last_cfg.get("device"),
        "params": last_cfg.get("num_params"),
        "step": steps[-1]["step"] if steps else 0,
        "max_iters": last_cfg.get("max_iters"),
        "status": run_status(events, alive),
        "resumes": max(0, len(configs) - 1),
        "first_loss": losses[0] if losses else None,
        "last_loss": statistics.fmean(tail) if tail else None,
        "min_loss": min(losses) if losses else None,
        "last_val_loss": vals[-1] if vals else None,
        "best_val_loss": min(vals) if vals else None,
        "tok_per_s": statistics.median(speeds) if speeds else None,
        "step_ms": statistics.median(_num([s.get("step_ms") for s in steps])) if steps else None,
        "mfu": min(1.0, statistics.median(mfus)) if mfus else None,
        "peak_flops": peak_event.get("peak_flops"),
        "peak_source": peak_event.get("peak_source"),
        "peak_bytes_in_use": int(max(peaks)) if peaks else None,
        "pool_bytes_reserved": int(max(reserved)) if reserved else None,
        "clipped_steps": clipped,
        "clipped_after_warmup": late_clipped,
        "steps_after_warmup": late_steps,
        "skips": dict(Counter(e.get("reason") for e in events if e["event"] == "skip")),
        "checkpoints": len(ckpts),
        "last_checkpoint": ckpts[-1].get("path") if ckpts else None,
        "wall_s": training_seconds(events),
    }


def _memory(s: dict[str, Any]) -> str:
    peak, reserved = s.get("peak_bytes_in_use"), s.get("pool_bytes_reserved")
    if peak is None and reserved is None:
        return "-"
    mib = lambda v: "-" if v is None else f"{v / (1 << 20):,.0f} MiB"  # noqa: E731
    return f"{mib(peak)} peak in use, {mib(reserved)} reserved (the device pool's most over the run)"


def format_summary(s: dict[str, Any]) -> str:
    """The summary as an aligned two-column table."""
    def f(v: Any, spec: str = ".4f") -> str:
        if v is None:
            return "-"
        if isinstance(v, int) and not isinstance(v, bool):
            return f"{v:,}"
        return format(v, spec) if isinstance(v, float) else str(v)

    skips = ", ".join(f"{k}: {v}" for k, v in s["skips"].items()) or "none"
    rows = [
        ("backend", f"{f(s['backend'])} on {f(s['device'])}"),
        ("parameters", f(s["params"])),
        ("progress", f"step {s['step']} / {f(s['max_iters'])} ({s['status']}, {s['resumes']} resume(s))"),
        ("train loss", f"{f(s['first_loss'])} first -> {f(s['last_loss'])} mean of last 10 steps "
                       f"(min {f(s['min_loss'])})"),
        ("val loss", f"{f(s['last_val_loss'])} (best {f(s['best_val_loss'])})"),
        ("throughput", f"{f(s['tok_per_s'], ',.0f')} tok/s, {f(s['step_ms'], '.1f')} ms/step (median)"),
        ("mfu", f(s["mfu"], ".1%") + (f" of {s['peak_flops'] / 1e9:,.1f} GFLOP/s: {s['peak_source']}"
                                       if s.get("peak_flops") and s.get("peak_source") else "")),
        ("device memory", _memory(s)),
        ("clipped steps", str(s["clipped_steps"])),
        ("skipped steps", skips),
        ("checkpoints", f"{s['checkpoints']} written, last {f(s['last_checkpoint'])}"),
        ("wall time", f"{s['wall_s']:.1f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    warning = clip_warning(s.get("clipped_after_warmup") or 0, s.get("steps_after_warmup") or 0)
    return "\n".join([f"{k:<{width}}  {v}" for k, v in rows] + ([warning] if warning else []))
