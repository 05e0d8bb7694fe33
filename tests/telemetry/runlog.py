"""A realistic fabricated metrics.jsonl (the fields the trainer logs, from a real lavapipe run), for fast tests."""

from __future__ import annotations

import json
import math
from pathlib import Path


def config_event(start_step: int = 0, max_iters: int = 40, lr: float = 2e-3, t: float = 0.0) -> dict:
    """The trainer's first event of a process."""
    return {"event": "config", "t": t, "config": {"model": {"arch": "llama", "n_layer": 4, "n_embd": 128},
                                                   "optim": {"lr": lr, "grad_clip": 1.0},
                                                   "train": {"max_iters": max_iters, "batch_size": 4}},
            "backend": "helios", "device": "llvmpipe (LLVM 15.0.6, 256 bits)", "num_params": 1836160,
            "flops_per_token": 11803392.0, "peak_flops": None, "start_step": start_step, "max_iters": max_iters,
            "resumed_from": f"ckpt-{start_step}" if start_step else None, "train_tokens": 32770, "val_tokens": 1412}


def step_event(i: int, lr: float = 2e-3, offset: float = 0.0) -> dict:
    """One training step, shaped like the trainer's (counters included)."""
    return {"event": "step", "t": 1.0 + i * 0.2, "step": i, "loss": 8.4 * math.exp(-i / 60) + offset,
            "lr": lr, "grad_norm": 2.7 / (1 + i / 10) + (3.0 if i % 13 == 0 else 0.0),
            "clip_coef": 0.4 if i % 13 == 0 else 1.0, "skipped": None, "tok_per_s": 2500.0 + 10 * (i % 7),
            "step_ms": 200.0, "fwd_ms": 3.2, "bwd_ms": 8.6, "opt_ms": 0.15, "wait_ms": 188.0,
            "dispatches": 145, "submits": 2, "barriers": 103, "host_waits": 1, "pool_bytes": 134217728,
            "pool_regions": 292, "pool_classes": 32, "device_allocs": 0,
            "pool_peak_in_use": 71303168 + 4096 * i, "mfu": None, "rss_mb": 390.4}


def run_events(steps: int = 40, lr: float = 2e-3, offset: float = 0.0, skip_at: int | None = 17) -> list[dict]:
    """A finished run: config, steps (one skipped), evals and samples every 10 steps, checkpoints, end."""
    events = [config_event(max_iters=steps, lr=lr)]
    for i in range(1, steps + 1):
        events.append(step_event(i, lr, offset))
        if i == skip_at:
            events[-1].update(loss=None, grad_norm=None, skipped="nan")
            events.append({"event": "skip", "t": events[-1]["t"], "step": i, "reason": "nan", "loss": None,
                           "grad_norm": None, "policy": "skip"})
        if i % 10 == 0:
            events.append({"event": "eval", "t": events[-1]["t"], "step": i, "val_loss": 7.7 - i / 40, "ms": 90.0})
            events.append({"event": "sample", "t": events[-1]["t"], "step": i, "prompt": "\n",
                           "text": f"ROMEO: sample at step {i} <b>not html</b>"})
            events.append({"event": "ckpt", "t": events[-1]["t"], "step": i, "path": f"ckpt-{i}",
                           "reason": "interval", "ms": 12.0})
    events.append({"event": "end", "t": events[-1]["t"] + 0.1, "step": steps, "status": "done"})
    return events


def write_run(run_dir: Path, events: list[dict], tail: str = "") -> Path:
    """Write events (and an optional torn last line) as RUN_DIR/metrics.jsonl; returns the run dir."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + tail)
    return run_dir
