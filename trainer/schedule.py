"""Learning-rate schedule: linear warmup, then cosine/linear decay (or constant) down to min_lr."""

from __future__ import annotations

import math

from trainer.config import ScheduleConfig


def lr_at(it: int, sched: ScheduleConfig, base_lr: float) -> float:
    """Learning rate for 0-based iteration `it`.

    Warmup ramps (it+1)/warmup_iters * base_lr so the first step is not zero; after lr_decay_iters the
    rate stays at min_lr.
    """
    end = sched.lr_decay_iters if sched.lr_decay_iters is not None else it
    warmup = warmup_steps(sched)
    if it < warmup:
        return base_lr * (it + 1) / warmup
    if sched.decay == "constant":
        return base_lr
    if it >= end:
        return sched.min_lr
    ratio = (it - warmup) / max(1, end - warmup)
    if sched.decay == "cosine":
        coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    else:
        coeff = 1.0 - ratio
    return sched.min_lr + coeff * (base_lr - sched.min_lr)


def warmup_steps(sched: ScheduleConfig) -> int:
    """The steps the warmup takes: warmup_iters, but never past lr_decay_iters (which defaults to max_iters, and
    is refused below warmup_iters when set), so a run shorter than its warmup warms up over the whole run."""
    if sched.lr_decay_iters is None:
        return sched.warmup_iters
    return min(sched.warmup_iters, sched.lr_decay_iters)


def warmup_warning(sched: ScheduleConfig) -> str | None:
    """The one-line warning for a warmup clamped to the run's length (None when it is not)."""
    steps = warmup_steps(sched)
    if steps == sched.warmup_iters:
        return None
    return f"warmup_iters {sched.warmup_iters} > max_iters {steps}: warming up over {steps} steps"
