"""The generic tuner: every family with choices, timed at the shapes a real training step asks for.

Derived from the selection contract, with no knob per family (helios.kernels.contract.selection):
1. One step runs under `selection.recording()`: that gives every (family, shape, dtype) the step asks for.
2. A family's candidates at a (shape, dtype) are its rule's choices (`Family.candidates`): each is handed to
   the rule as a forced choice; one the rule refuses on this device (ValueError) is dropped, and choices the
   rule turns into the same plan (a tiling the device cannot run gives way to the table) are timed once.
   Keys where every candidate plans what the table plans have nothing to tune.
3. Each remaining candidate is timed by running the whole step with that one choice forced at that one
   (family, shape, dtype) (`selection.trying`), against the step with the table's choice, in the same
   sitting: the difference is that family's at that shape. Two clocks:
   - the kernel clock, where the caller can make the step record lazily (`lazy`) and the device has
     timestamps: `repeats` lazily recorded steps under helios.runtime.profiling(), and the median device ms of
     just the dispatches where the candidate's step launches something else than the table's (another kernel,
     variant, specialization or grid; more or fewer dispatches: `differing_ms` lines the steps up). The rest of
     the step is the same work, and its noise (a whole step varies by tens of percent on a shared CPU) would
     swamp a kernel's difference of a few percent of the step;
   - else the step as it trains: captured and replayed (`reset` drops the capture, two warm-up steps record
     and capture it), median wall-clock ms of `repeats` replayed steps (helios.bench.harness.device_sample).
   A candidate whose launch fails (the device contract refuses it) is never stored.
4. The winner is stored per (device key incl. driver build, family, shape key, dtype) in the TuningStore, which
   `selection.choose` then prefers over the table; it must beat the table by `margin` in three sittings (a
   whole-step figure on a shared CPU is noisy), else "table" is stored: measured, and the table kept. Winners are
   stored as each key is decided, so later keys are timed on top of earlier winners. The two confirming sittings
   time the candidate first in one and the table first in the other. Timing whole steps on a CPU driver
   (lavapipe, SwiftShader: its worker threads are this process's), they also read the process's CPU time, and a
   winner may not cost more of it than the table (`confirmed`): another program's burst of load slows a step's
   wall clock, not the CPU time it spends, so a slower kernel timed in a quiet moment cannot win against the
   table timed in a busy one (seen at load 6: tiled128, 7x slower alone, "won" a matmul shape on wall time).

Keys are tuned in order of how often the step launches them, until `budget_s` runs out; the rest are reported
as skipped (and a later `only_missing` run picks them up). Library code: it prints nothing; `progress(done,
total, what)` is called per timed candidate. `tune_config` builds the model a trainer config trains (as
trainer/backends/helios.py does), one micro-batch of its batch and block size in its dtype, and tunes that.
"""

from __future__ import annotations

import difflib
import statistics
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from helios.bench.harness import device_sample
from helios.errors import HeliosError
from helios.kernels.contract import selection
from helios.kernels.contract.tuning import STORE, TuningStore, key
from helios.runtime import get_runtime

Key = tuple[str, tuple, str]  # (family, shape, dtype)
CONFIRMATIONS = 2  # sittings after the first that must each confirm a winner (see `tune`)
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Trial:
    """One tuned (family, shape, dtype): the table's choice and the winner (labels), their step ms, and every
    timed candidate's ms."""

    family: str
    shape: tuple
    dtype: str
    table: str
    winner: str
    table_ms: float
    winner_ms: float
    timed: dict[str, float] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        """Table step time over the stored winner's (1.0 when the table was kept)."""
        return self.table_ms / self.winner_ms if self.winner_ms > 0 else 1.0


@dataclass
class Report:
    """What a tuning run did: the tuned keys, the ones the budget left, its seconds and where winners went."""

    trials: list[Trial] = field(default_factory=list)
    skipped: list[Key] = field(default_factory=list)
    already: list[Key] = field(default_factory=list)  # stored before (only_missing)
    absent: list[str] = field(default_factory=list)  # families asked for (or with choices) the step never launches
    seconds: float = 0.0
    stored_in: str | None = None


def tunable_families() -> list[selection.Family]:
    """Every family with more than one candidate (what `bench tune --help` lists)."""
    return [f for f in selection.families() if len(f.candidates) > 1]


def _plans(info, family: str, shape: tuple, dtype: str) -> list[tuple[Any, Any]]:
    """(choice, the plan the rule makes of it) at (shape, dtype) for each candidate the rule accepts on info's
    device (one it refuses, a feature the device lacks, raises ValueError and is left out)."""
    f = selection.declared(family)
    plans = []
    for choice in f.candidates:
        try:
            plans.append((choice, f.rule(info, shape, dtype, f.check(choice))))
        except ValueError:
            continue
    return plans


def candidates(info, family: str, shape: tuple, dtype: str) -> tuple[Any, dict[str, Any]]:
    """(the table's plan, {label: choice}) at (shape, dtype) on info's device: one choice per distinct plan other
    than the table's, dropping those the rule refuses."""
    table = selection.declared(family).rule(info, shape, dtype, None)
    seen, out = {table}, {}
    for choice, plan in _plans(info, family, shape, dtype):
        if plan not in seen:
            seen.add(plan)
            out[selection.label(choice)] = choice
    return table, out


def table_label(info, family: str, shape: tuple, dtype: str, table_plan) -> str:
    """The name of the choice the table makes: the candidate that is the table's plan itself, else the first
    planning the same, else "table". (A forced choice the device cannot run gives way to the table and so plans
    the same: on SwiftShader, without int64, forcing reg8x8 runs the table's tiled32, which is its name.)"""
    same = [c for c, plan in _plans(info, family, shape, dtype) if plan == table_plan]
    exact = [c for c in same if c == table_plan]
    return selection.label((exact or same)[0]) if same else selection.TABLE


def time_step(step: Callable[[], Any], reset: Callable[[], None], repeats: int, warmup: int = 2) -> float:
    """Median wall-clock ms of `step` over `repeats` runs after `reset` and `warmup` runs."""
    return time_step_cpu(step, reset, repeats, warmup)[0]


def time_step_cpu(step: Callable[[], Any], reset: Callable[[], None], repeats: int,
                  warmup: int = 2) -> tuple[float, float]:
    """(median wall-clock ms, median process CPU ms) of `step` over `repeats` runs after `reset` and `warmup` runs
    (the CPU figure counts a CPU driver's worker threads, which run in this process)."""
    reset()
    for _ in range(warmup):
        step()
    walls, cpus = [], []
    for _ in range(repeats):
        c0 = time.process_time()
        walls.append(device_sample(step, 1))
        cpus.append((time.process_time() - c0) * 1e3)
    return statistics.median(walls), statistics.median(cpus)


def confirmed(table: tuple[float, float], best: tuple[float, float], margin: float, cpu_device: bool) -> bool:
    """Whether a sitting confirms a winner: (wall ms, CPU ms) of the table and of the candidate. It must be `margin`
    faster on the wall clock and, on a CPU driver, spend no more CPU time than the table's plus `margin` of the
    table's step (a kernel that truly spreads the same work over more cores may win; one that only looked fast
    while the table's timing was slowed by other programs may not)."""
    faster = best[0] < table[0] * (1 - margin)
    return faster and (not cpu_device or best[1] <= table[1] + margin * table[0])


def kernel_runs(step: Callable[[], Any], reset: Callable[[], None], repeats: int,
                warmup: int = 2) -> list[list[tuple]]:
    """`repeats` profiled calls of a lazily recorded `step` after `reset` and `warmup` calls: each call's
    (kernel, variant, device ms, launch) per dispatch, in launch order (helios.runtime.profiling's timestamp pairs;
    `launch` tells two launches of one kernel and variant apart: the pipeline and the grid)."""
    from helios.runtime.profiling import profiling

    reset()
    for _ in range(warmup):
        step()
    runs = []
    for _ in range(repeats):
        with profiling() as prof:
            step()
        runs.append([(*d, launch) for d, launch in zip(prof.dispatches, prof.launches, strict=True)])
    return runs


def differing_ms(table: list[list[tuple]], candidate: list[list[tuple]]) -> tuple[float, float]:
    """(table ms, candidate ms): the medians over calls of the device ms of the dispatches where the two steps launch
    something else (the choice's own launches: the rest of the step is the same work, whose noise would swamp a
    kernel's difference). A dispatch is (kernel, variant, ms[, launch]): where `launch` is given (kernel_runs: the
    pipeline and the grid), a launch of the same kernel and variant with another specialization or grid differs
    too; the whole steps' summed device ms where nothing differs (a choice that changes only push constants).

    The two launch sequences are lined up as a diff, so a choice that changes how many dispatches run (a two-pass
    sum, K chunks, a fused Delta) is timed by the launches it adds, drops or replaces, wherever they sit; launches
    of the same kernels right beside those (a first pass that lines up with the one-pass launch it replaces, the
    first of the K chunks) count on both sides too, since their sizes differ even where kernel and variant agree."""
    first_t, first_c = [d[:2] + d[3:] for d in table[0]], [d[:2] + d[3:] for d in candidate[0]]
    ops = difflib.SequenceMatcher(None, first_t, first_c, autojunk=False).get_opcodes()
    marked_t, marked_c = set(), set()
    for n, (op, t0, t1, c0, c1) in enumerate(ops):
        if op == "equal":
            continue
        marked_t.update(range(t0, t1))
        marked_c.update(range(c0, c1))
        names = {d[0] for d in first_t[t0:t1] + first_c[c0:c1]}
        if n and ops[n - 1][0] == "equal":  # the same kernels just before, lined up on both sides
            _, e0, e1, f0, _ = ops[n - 1]
            back = _run_of(first_t, range(e1 - 1, e0 - 1, -1), names)
            marked_t.update(range(e1 - back, e1))
            marked_c.update(range(f0 + (e1 - e0) - back, f0 + (e1 - e0)))
        if n + 1 < len(ops) and ops[n + 1][0] == "equal":  # and just after
            _, e0, e1, f0, _ = ops[n + 1]
            ahead = _run_of(first_t, range(e0, e1), names)
            marked_t.update(range(e0, e0 + ahead))
            marked_c.update(range(f0, f0 + ahead))

    def ms(runs, marked) -> float:
        whole = not (marked_t or marked_c)
        return statistics.median(sum(d[2] for d in run) if whole else sum(run[i][2] for i in marked) for run in runs)

    return ms(table, marked_t), ms(candidate, marked_c)


def _run_of(launches: list, positions: range, names: set) -> int:
    """How many of `positions`, taken in order, launch one of the kernels `names` before the first that does not."""
    return next((i for i, p in enumerate(positions) if launches[p][0] not in names), len(positions))


def tune(step: Callable[[], Any], reset: Callable[[], None] = lambda: None, *, info=None,
         families: Collection[str] | None = None, budget_s: float = 120.0, repeats: int = 3, warmup: int = 2,
         margin: float = 0.02, store: TuningStore = STORE, save: bool = True, only_missing: bool = False,
         progress: Progress | None = None, lazy: Callable[[bool], None] | None = None) -> Report:
    """Tune every family with choices (or those in `families`) at the (shape, dtype)s `step` asks for; see the
    module docstring. `save=False` times and reports but stores nothing. `lazy(True)` makes `step` record its
    launches instead of replaying a capture (`lazy(False)` puts it back): given, on a device with timestamps, the
    candidates are timed by the kernel clock (`differing_ms`), else by whole replayed steps."""
    if info is None:
        from helios.device import get_device

        info = get_device().info
    t0 = time.perf_counter()
    report = Report()
    reset()
    with selection.recording() as calls:
        step()
    asked = set(families) if families is not None else {f.name for f in tunable_families()}
    report.absent = sorted(asked - {fam for fam, _, _ in calls})
    work = []
    for fam, shape, dtype in sorted(calls, key=calls.get, reverse=True):  # the most launched first
        f = selection.declared(fam)
        if len(f.candidates) < 2 or (families is not None and fam not in families):
            continue
        table, cands = candidates(info, fam, shape, dtype)
        if not cands:
            continue
        if only_missing and store.winner(info, fam, key(selection.shape_key(shape), dtype)) is not None:
            report.already.append((fam, shape, dtype))
            continue
        work.append(((fam, shape, dtype), table, cands))
    kernels = lazy is not None and bool(work) and get_runtime().has_timestamps
    if kernels:
        lazy(True)
    try:
        _tune_keys(work, _Clock(step, reset, repeats, warmup, kernels), info, report, t0 + budget_s, margin, store,
                   save, progress)
    finally:
        if kernels:
            lazy(False)
        reset()
    report.seconds = time.perf_counter() - t0
    return report


@dataclass(frozen=True)
class _Clock:
    """How one side of a sitting is timed: `repeats` samples of `step` after `warmup`, by the kernel clock
    (`kernels`: kernel_runs) or as whole replayed steps (time_step_cpu's wall and CPU ms)."""

    step: Callable[[], Any]
    reset: Callable[[], None]
    repeats: int
    warmup: int
    kernels: bool

    def sample(self):
        if self.kernels:
            return kernel_runs(self.step, self.reset, self.repeats, self.warmup)
        return time_step_cpu(self.step, self.reset, self.repeats, self.warmup)

    def versus(self, table, candidate) -> tuple[tuple[float, float], tuple[float, float]]:
        """((table ms, its CPU ms), (candidate ms, its CPU ms)) of one sitting's two samples; the kernel clock's
        are device ms of the differing dispatches, with no CPU figure (0: the guard is for whole steps)."""
        if self.kernels:
            t, c = differing_ms(table, candidate)
            return (t, 0.0), (c, 0.0)
        return table, candidate


def _tune_keys(work, clock: _Clock, info, report: Report, deadline: float, margin: float, store: TuningStore,
               save: bool, progress: Progress | None) -> None:
    """Tune each (key, table, candidates) of `work` in order until `deadline` (a perf_counter time); the rest
    are reported as skipped."""
    total = sum(1 + len(c) for _, _, c in work)
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total, what)

    per_timing = None  # seconds one timing takes, from the first
    for i, (k, table, cands) in enumerate(work):
        if per_timing is not None and deadline - time.perf_counter() < per_timing * (1 + len(cands)):
            report.skipped.extend(w for w, _, _ in work[i:])
            break
        trial, winner, first_timing = _tune_key(k, table, cands, clock, info, margin, tick)
        per_timing = per_timing or first_timing
        report.trials.append(trial)
        if save:
            fam, shape, dtype = k
            path = store.save(info, fam, {key(selection.shape_key(shape), dtype): winner})
            report.stored_in = str(path) if path else "nowhere: the cache directory is not writable"


def _tune_key(k: Key, table, cands: dict, clock: _Clock, info, margin: float,
              tick: Callable[[str], None]) -> tuple[Trial, Any, float]:
    """(the Trial, the choice to store: the winner or selection.TABLE, the seconds the table's first sample took)
    of one key: the table and every candidate timed in a first sitting, then the best confirmed in
    CONFIRMATIONS more."""
    fam, shape, dtype = k
    what = f"{fam} {selection.shape_key(shape)} {dtype}"
    s0 = time.perf_counter()
    table_sample = clock.sample()
    first_timing = time.perf_counter() - s0
    tick(what)
    timed: dict[str, tuple[float, float]] = {}  # candidate -> (table ms, its ms) in the first sitting
    for name, choice in cands.items():
        try:
            with selection.trying(fam, shape, dtype, choice):
                sample = clock.sample()
            t, c = clock.versus(table_sample, sample)
            timed[name] = (t[0], c[0])
        except (HeliosError, ValueError):  # the device contract refused a launch: never a winner
            clock.reset()
        tick(what)
    best = min(timed, key=lambda n: timed[n][1] / timed[n][0] if timed[n][0] else 1.0, default=None)
    won = best is not None and timed[best][1] < timed[best][0] * (1 - margin)
    sides = ([timed[best][0]], [timed[best][1]]) if best is not None else ([], [])
    # Confirmed in CONFIRMATIONS more sittings, the candidate timed first and then the table first: one noisy
    # sample, or a burst of load that happens to fall on the table's timings, does not make a winner.
    for candidate_first in (True, False)[:CONFIRMATIONS] if won else ():
        sitting = {}
        for side in (("candidate", "table") if candidate_first else ("table", "candidate")):
            if side == "table":
                sitting[side] = clock.sample()
            else:
                with selection.trying(fam, shape, dtype, cands[best]):
                    sitting[side] = clock.sample()
        t, c = clock.versus(sitting["table"], sitting["candidate"])
        sides[0].append(t[0])
        sides[1].append(c[0])
        if not confirmed(t, c, margin, info.is_cpu and not clock.kernels):
            won = False
            break
    table_ms = statistics.mean(sides[0]) if best is not None else 0.0
    tname = table_label(info, fam, shape, dtype, table)
    times = {tname: table_ms, **{n: tc[1] for n, tc in timed.items()}}
    trial = Trial(fam, shape, dtype, tname, best if won else tname, table_ms,
                  statistics.mean(sides[1]) if won else table_ms, times)
    return trial, best if won else selection.TABLE, first_timing


def random_micro_batches(cfg, seed: int, accum: int = 1) -> list[tuple]:
    """`accum` copies of one (x, y) micro-batch of seeded random tokens at trainer config `cfg`'s batch and block
    size: what a tuned step trains on (the kernels chosen depend on the shapes, not the tokens)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    shape = (cfg.train.batch_size, cfg.model.block_size)
    x = rng.integers(0, cfg.model.vocab_size, size=shape, dtype=np.int32)
    y = rng.integers(0, cfg.model.vocab_size, size=shape, dtype=np.int32)
    return [(x, y)] * accum


def config_step(cfg, seed: int = 0):
    """(step, reset, backend) for a trainer config: its model (trainer/backends/helios.py's HeliosBackend) and
    one micro-batch of its batch and block size of seeded random tokens, trained with its optimiser settings."""
    from trainer.backends.helios import HeliosBackend

    backend = HeliosBackend.create(cfg.model, cfg.optim, seed)
    micro = random_micro_batches(cfg, seed)

    def step():
        return backend.train_step(micro, lr=cfg.optim.lr, grad_clip=cfg.optim.grad_clip, spike_threshold=None)

    return step, backend.invalidate_capture, backend


def tune_config(cfg, **options) -> Report:
    """Tune the shapes trainer config `cfg` trains (see `tune` for the options), on a model of its own."""
    step, reset, backend = config_step(cfg)
    try:
        return tune(step, reset, lazy=lambda on: backend.set_replay(not on), **options)
    finally:
        backend.invalidate_capture()


__all__ = ["Trial", "Report", "tunable_families", "candidates", "table_label", "time_step", "time_step_cpu",
           "confirmed", "tune", "random_micro_batches", "config_step", "tune_config"]
