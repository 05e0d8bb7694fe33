"""Learning-rate schedule: linear warmup, then cosine/linear decay (or constant) down to min_lr."""

from __future__ import annotations

import math

from trainer.config import ScheduleConfig


def lr_at(it: int, sched: ScheduleConfig, base_lr: float) -> float:
    """Learning rate for 0-based iteration `it`.

    Warmup ramps (it+1)/warmup_iters * base_lr so the first step is not zero; after lr_decay_iters the
    rate stays at min_lr.
    """
    if it < sched.warmup_iters:
        return base_lr * (it + 1) / sched.warmup_iters
    if sched.decay == "constant":
        return base_lr
    end = sched.lr_decay_iters if sched.lr_decay_iters is not None else it
    if it >= end:
        return sched.min_lr
    ratio = (it - sched.warmup_iters) / max(1, end - sched.warmup_iters)
    if sched.decay == "cosine":
        coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    else:
        coeff = 1.0 - ratio
    return sched.min_lr + coeff * (base_lr - sched.min_lr)
