"""Per-family breakdown of a training step: `python -m helios.bench profile CONFIG.toml [--steps N] [--by kernel]`.

Builds the model a trainer config trains, as the trainer's helios backend does (helios.bench.tuner.config_step:
one micro-batch of the config's batch and block size, seeded random tokens), runs warm-up steps, then profiles
`--steps` lazily recorded steps under helios.runtime.profiling(): a timestamp pair around every dispatch, no sync
per dispatch. Prints, per family (or per kernel and variant with --by kernel), device ms per step, its share of
the dispatches' summed device ms, and dispatches per step, sorted by time; then the totals against the measured
step: the profiled steps' wall ms, and unprofiled steps' wall ms lazily recorded and replayed (as the trainer
trains them; median of --steps each).

How and what it costs: each timestamp waits for all earlier commands, so a device that overlaps dispatches is
serialised (its sum is then an upper bound); lavapipe runs dispatches one after another anyway. The pairs add
two commands per dispatch and a query read at the end; compare profiled with lazy wall ms for the overhead. On a
2-core CPU device the host's recording of a lazy step also competes with the driver's threads, so the dispatches'
sum can exceed a replayed step's wall ms (by ~15% for configs/shakespeare.toml): read the shares. A
family is the kernel name's family by the table FAMILIES below (a kernel's own name, not the selection contract,
which chooses variants but does not name its kernels).
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

from helios.bench import catalogue
from helios.bench.harness import device_name, device_sample

BENCH = catalogue.declare(__name__, why="profiles a config's training step, not kernels")

# Kernel-name prefix -> family, first match wins; a kernel matching none is "elementwise".
FAMILIES: tuple[tuple[str, str], ...] = (
    ("matmul", "matmul"),
    ("attention_forward", "attention forward"),
    ("attention_backward", "attention backward"),
    ("layernorm", "rows (layernorm)"),
    ("rmsnorm", "rows (rmsnorm)"),
    ("softmax", "rows (softmax)"),
    ("cross_entropy", "cross_entropy"),
    ("embedding", "embedding"),
    ("adamw", "adamw"),
    ("grad_norm", "grad_norm"),
    ("sum_rows", "sum_rows"),
    ("reduce", "reduce"),
    ("rope", "rope"),
)


def family_of(kernel: str) -> str:
    """The family a kernel name belongs to (FAMILIES; "elementwise" by default)."""
    return next((fam for prefix, fam in FAMILIES if kernel.startswith(prefix)), "elementwise")


def add_arguments(parser) -> None:
    parser.add_argument("config", metavar="CONFIG.toml", help="a trainer config: profile its training step")
    parser.add_argument("--steps", type=int, default=5, help="profiled (and timed) steps (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    parser.add_argument("--by", choices=("family", "kernel"), default="family",
                        help="one row per family (default) or per kernel and variant")


def profile_step(step, steps: int = 5, warmup: int = 2, by: str = "family") -> tuple[list[dict], dict]:
    """(one row per group: name, kernels, ms and dispatches per step, share; totals) of `steps` profiled calls of
    `step` (which must record lazily) after `warmup` calls."""
    import helios.runtime as rt

    for _ in range(warmup):
        step()
    rt.sync()
    before = rt.counters()["dispatches"]
    t0 = time.perf_counter()
    with rt.profiling() as prof:
        for _ in range(steps):
            step()
    wall = (time.perf_counter() - t0) * 1e3 / steps
    dispatches = rt.counters()["dispatches"] - before
    ms, count, kernels = defaultdict(float), defaultdict(int), defaultdict(set)
    for kernel, variant, t in prof.dispatches:
        name = family_of(kernel) if by == "family" else f"{kernel}:{variant}"
        ms[name] += t / steps
        count[name] += 1
        kernels[name].add(f"{kernel}:{variant}")
    total = sum(ms.values())
    rows = [{"name": n, "kernels": ", ".join(sorted(kernels[n])), "ms": ms[n], "share": ms[n] / total if total else 0.0,
             "dispatches": count[n] / steps} for n in sorted(ms, key=ms.get, reverse=True)]
    totals = {"device_ms": total, "profiled_ms": wall, "dispatches": dispatches / steps,
              "profiled_dispatches": len(prof.dispatches) / steps}
    return rows, totals


def run(args):
    from helios.bench.tuner import config_step
    from trainer.config import load_config

    cfg = load_config(args.config)
    step, reset, backend = config_step(cfg)
    try:
        backend.set_replay(False)
        rows, totals = profile_step(step, args.steps, args.warmup, args.by)
        lazy = statistics.median(device_sample(step, 1) for _ in range(args.steps))
        backend.set_replay(True)
        for _ in range(2):  # record, then capture
            step()
        replay = statistics.median(device_sample(step, 1) for _ in range(args.steps))
    finally:
        reset()
    m = cfg.model
    shape = f"L{m.n_layer} C{m.n_embd} T{m.block_size} B{cfg.train.batch_size} V{m.vocab_size}"
    dev, now = device_name(), time.time()
    for r in rows:
        yield {"event": "bench", "t": now, "kernel": "profile", "by": args.by, **r, "shape": shape,
               "step_device_ms": totals["device_ms"], "step_profiled_ms": totals["profiled_ms"],
               "step_lazy_ms": lazy, "step_replay_ms": replay, "step_dispatches": totals["dispatches"],
               "device": dev}


def format_records(records) -> str:
    """The breakdown as a table, then the step's totals."""
    if not records:
        return "no dispatches"
    head = ("family" if records[0]["by"] == "family" else "kernel:variant", "ms/step", "share", "dispatches/step")
    rows = [head] + [(r["name"], f"{r['ms']:.3f}", f"{100 * r['share']:.1f}%", f"{r['dispatches']:g}")
                     for r in records]
    w = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(row)) for row in rows]
    r = records[0]
    lines += [f"total device ms/step {r['step_device_ms']:.2f} over {r['step_dispatches']:g} dispatches; measured "
              f"step wall ms: profiled {r['step_profiled_ms']:.2f}, lazy {r['step_lazy_ms']:.2f}, "
              f"replayed {r['step_replay_ms']:.2f}",
              f"{r['shape']}  device: {r['device']}"]
    return "\n".join(lines)
