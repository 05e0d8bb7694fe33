"""Dispatch overhead: host recording cost, and end-to-end cost batched vs one submit per dispatch.

For N tiny dispatches (one workgroup each), in two patterns:
- dependent: N in-place increments of one buffer, so every dispatch needs a barrier after the previous one;
- independent: N dispatches reading one input and writing N disjoint views of one arena (no barriers).
Reported per dispatch: `us_record_per_op` (launch() calls only, nothing submitted; `_cpu`: this thread's
CPU time, which a busy machine does not inflate as much), `us_per_op_batched` (record N under the
runtime's submit policy, then sync; `submits_batched` says how many submits that took),
`us_per_op_unbatched` (record, submit and wait each one) and `speedup`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator

import numpy as np

from helios.bench import catalogue
from helios.spirv import Kernel, KernelBuilder, Variant, f32, u32

BENCH = catalogue.declare(__name__, order=20)

LOCAL = 64


def _build_increment(b: KernelBuilder, v: Variant) -> None:
    b.local_size(LOCAL)
    x = b.buffer(0, f32, "rw")
    n = b.push("n", u32)
    i = b.global_id(0)
    with b.if_(i < n):
        x[i] = x[i] + 1.0


def _build_copy_plus_one(b: KernelBuilder, v: Variant) -> None:
    b.local_size(LOCAL)
    x, y = b.buffer(0, f32, "r"), b.buffer(1, f32, "w")
    n = b.push("n", u32)
    i = b.global_id(0)
    with b.if_(i < n):
        y[i] = x[i] + 1.0


INCREMENT = Kernel("bench_dispatch_increment", _build_increment, register=False)
PLUS_ONE = Kernel("bench_dispatch_plus_one", _build_copy_plus_one, register=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ops", type=int, default=1000, help="dispatches per batch (default 1000)")
    parser.add_argument("--unbatched-ops", type=int, default=200,
                        help="dispatches timed one submit each (default 200; each costs a host round trip)")
    parser.add_argument("--repeats", type=int, default=5, help="samples per figure; the median is reported")


def _patterns(n_ops: int):
    from helios import runtime as rt

    x = rt.zeros(LOCAL)
    src = rt.from_numpy(np.arange(LOCAL, dtype=np.float32))
    # Outputs are views of one arena: disjoint byte ranges of one buffer must not force barriers.
    arena = rt.empty(n_ops * LOCAL)
    outs = [arena.view(k * LOCAL, LOCAL) for k in range(n_ops)]
    push = {"n": LOCAL}

    def dependent(count: int) -> None:
        for _ in range(count):
            rt.launch(INCREMENT, [x], push, 1)

    def independent(count: int) -> None:
        for k in range(count):
            rt.launch(PLUS_ONE, [src, outs[k % n_ops]], push, 1)

    def check() -> None:
        if not np.all(arena.numpy()[: LOCAL] == np.arange(LOCAL, dtype=np.float32) + 1):
            raise AssertionError("dispatch benchmark: wrong results from the independent pattern")

    return {"dependent": dependent, "independent": independent}, check


def _median_us(fn, count: int, repeats: int, sync_inside: bool = False) -> float:
    from helios import runtime as rt

    samples = []
    for _ in range(repeats):
        rt.sync()
        t0 = time.perf_counter()
        if sync_inside:
            for _ in range(count):
                fn(1)
                rt.sync()
        else:
            fn(count)
            rt.sync()
        samples.append((time.perf_counter() - t0) * 1e6 / count)
    return statistics.median(samples)


def _record_us(fn, count: int, repeats: int) -> tuple[float, float]:
    """Median wall-clock and thread-CPU microseconds per launch() while recording (nothing submitted).

    The CPU figure is what recording costs this thread; on a busy machine the wall clock also counts
    time the thread waited for a core.
    """
    from helios import runtime as rt

    wall, cpu = [], []
    for _ in range(repeats):
        rt.sync()
        c0, t0 = time.thread_time(), time.perf_counter()
        fn(count)
        wall.append((time.perf_counter() - t0) * 1e6 / count)
        cpu.append((time.thread_time() - c0) * 1e6 / count)
        rt.sync()
    return statistics.median(wall), statistics.median(cpu)


def run(args: argparse.Namespace) -> Iterator[dict]:
    """Yield one bench record per pattern."""
    from helios import runtime as rt
    from helios.bench.harness import device_name

    n_ops = args.ops
    rec = rt.get_runtime().recorder
    policy = {"flush_threshold": rec.flush_threshold, "eager_flush": rec.eager_flush}
    patterns, check = _patterns(n_ops)
    for name, fn in patterns.items():
        fn(4)  # creates the pipeline and warms the first-dispatch compile
        rt.sync()
        # Recording alone: no submit inside the timed loop.
        rt.configure(flush_threshold=max(policy["flush_threshold"], n_ops + 1), eager_flush=0)
        record, record_cpu = _record_us(fn, n_ops, args.repeats)
        rt.configure(**policy)  # batched: the runtime's own policy (early submits while the device idles)
        before = rt.counters()
        fn(n_ops)
        rt.sync()
        after = rt.counters()
        barriers = (after["barriers"] - before["barriers"]) / n_ops
        submits = after["submits"] - before["submits"]
        batched = _median_us(fn, n_ops, args.repeats)
        unbatched = _median_us(fn, args.unbatched_ops, args.repeats, sync_inside=True)
        yield {
            "event": "bench", "t": time.time(), "kernel": "dispatch", "variant": name, "device": device_name(),
            "ops": n_ops, "us_record_per_op": round(record, 3), "us_record_per_op_cpu": round(record_cpu, 3),
            "us_per_op_batched": round(batched, 3), "us_per_op_unbatched": round(unbatched, 3),
            "speedup": round(unbatched / batched, 2), "barriers_per_op": round(barriers, 3),
            "submits_batched": submits,
        }
    check()


def format_records(records: list[dict]) -> str:
    """A small text table for the non-JSON output."""
    cols = ("variant", "ops", "us_record_per_op", "us_record_per_op_cpu", "us_per_op_batched",
            "us_per_op_unbatched", "speedup", "barriers_per_op", "submits_batched")
    rows = [cols] + [tuple(str(r[c]) for c in cols) for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    if records:
        lines.append(f"device: {records[0]['device']}")
    return "\n".join(lines)
