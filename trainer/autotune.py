"""train.tune = "auto": before step 1, tune the kernel choices at the shapes this config trains, where none are
stored for this device yet (helios.bench.tuner; `python -m helios.bench tune CONFIG.toml` is the same by hand).

It runs on the run's own backend with one micro-batch of seeded random tokens at the config's batch and block
size, and puts the backend's state (parameters, AdamW moments and step, the dropout counter, the loss scale) back
afterwards, so the run trains from exactly where it would have: only the kernels chosen differ, within the op
specs' tolerances. Its budget is 10% of the run's estimated time (one timed step x the steps left), never past
CAP_S. Only a single-process run tunes (ranks tuning apart could choose apart).
"""

from __future__ import annotations

import time
from typing import Any

from trainer.backend import Backend
from trainer.config import Config

CAP_S = 60.0  # never spend more than this before step 1
SHARE = 0.10  # of the planned run's estimated time


def auto_tune(backend: Backend, cfg: Config, steps_left: int, world_size: int = 1) -> dict[str, Any] | None:
    """Tune where train.tune is "auto"; returns the `tune` event's fields (None: tuning is off)."""
    if cfg.train.tune != "auto":
        return None
    if not backend.kernel_choices:
        return {"status": "skipped", "reason": "this backend's kernels have no choices to tune"}
    if world_size > 1:
        return {"status": "skipped", "reason": "a data-parallel run does not tune (run `bench tune` first)"}
    from helios.bench.tuner import random_micro_batches, time_step, tune
    from helios.kernels.contract import selection

    t0 = time.perf_counter()
    micro = random_micro_batches(cfg, cfg.train.seed, cfg.train.grad_accum)
    state = backend.state_dict()

    def step():
        return backend.train_step(micro, cfg.optim.lr, cfg.optim.grad_clip, None)

    try:
        step_ms = time_step(step, backend.invalidate_capture, repeats=1)
        budget = min(CAP_S, SHARE * step_ms / 1000 * steps_left)
        report = tune(step, backend.invalidate_capture, budget_s=budget, only_missing=True,
                      lazy=lambda on: backend.set_replay(cfg.train.replay and not on))
    finally:
        backend.load_state_dict(state)
    winners: dict[str, dict[str, str]] = {}
    for t in report.trials:
        winners.setdefault(t.family, {})[f"{selection.shape_key(t.shape)} {t.dtype}"] = t.winner
    changes = [f"{t.family} {selection.shape_key(t.shape)} {t.dtype}: {t.table} -> {t.winner} ({t.speedup:.2f}x)"
               for t in report.trials if t.winner != t.table]
    status = "tuned" if report.trials else ("stored" if report.already and not report.skipped else "none")
    return {"status": status, "families": sorted(winners), "winners": winners, "tuned": len(report.trials),
            "changes": changes, "already_stored": len(report.already), "skipped": len(report.skipped),
            "budget_s": round(budget, 1), "step_ms": round(step_ms, 2), "seconds": round(time.perf_counter() - t0, 2),
            "stored_in": report.stored_in}
