"""Shared benchmark timing: device callables vs host references, bench records, a table printer.

A benchmark module builds, per shape, a *device callable* (enqueues helios launches, no sync) and a
*reference callable* (numpy or torch on the host, or torch on CUDA), then calls `compare(...)`, which
returns the `{"event": "bench", ...}` record. Device time comes from the runtime's timestamp queries
(`helios.runtime.timed`), falling back to sync + wall clock around a batch of calls. Host references run under
`OMP_WAIT_POLICY=PASSIVE` / a short OpenBLAS spin timeout and interleaved with the device runs (A B A B)
so that BLAS threads and lavapipe's worker threads don't spin against each other on a 2-core machine.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from helios import env

# Read when OpenBLAS / libgomp load, so set before numpy/torch are imported: `python -m helios.bench` imports this
# module first.
env.quiet_blas_threads()

Fn = Callable[[], Any]


# -- device side ---------------------------------------------------------------------------------

def _runtime():
    import helios.runtime as rt

    return rt


def _timestamp_helper():
    """`helios.runtime.timed` (timestamp queries around a block), or None on a runtime without it."""
    try:
        from helios.runtime import timed
    except ImportError:
        return None
    return timed


def device_name() -> str:
    """`name (driver info)` of the helios device, for the record's `device` field."""
    try:
        from helios.device import get_device

        info = get_device().info
        return f"{info.name} ({info.driver_name} {info.driver_info})".strip()
    except Exception:  # noqa: BLE001 - a record without a device name beats no record
        return "unknown"


def _sync() -> None:
    _runtime().sync()


def _batch_size(fn: Fn, target_ms: float) -> int:
    """How many calls of fn to put between two syncs so one sample lasts ~target_ms (amortises submit+wait)."""
    _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    once = (time.perf_counter() - t0) * 1e3
    return max(1, min(64, int(target_ms / max(once, 1e-3))))


def device_sample(fn: Fn, batch: int) -> float:
    """One wall-clock sample: ms per call of fn, over `batch` calls recorded between two syncs."""
    _sync()
    t0 = time.perf_counter()
    for _ in range(batch):
        fn()
    _sync()
    return (time.perf_counter() - t0) * 1e3 / batch


def timestamp_sample(fn: Fn, batch: int = 1) -> float:
    """One sample from GPU timestamps: ms per call of fn over `batch` calls (waits for the device)."""
    timed = _timestamp_helper()
    _sync()
    with timed() as t:
        for _ in range(batch):
            fn()
    return t.ms / batch


def _sampler(target_ms: float, fn: Fn) -> Callable[[], float]:
    """The device sampler: timestamps when the runtime has them, else sync + wall clock over a batch."""
    if _timestamp_helper() is not None:
        return lambda: timestamp_sample(fn)
    batch = _batch_size(fn, target_ms)
    return lambda: device_sample(fn, batch)


def time_device(fn: Fn, repeats: int = 10, warmup: int = 2, target_ms: float = 20.0) -> float:
    """Median ms of one call of a device callable (timestamp queries if available, else sync+wall clock)."""
    for _ in range(warmup):
        fn()
    sample = _sampler(target_ms, fn)
    return statistics.median(sample() for _ in range(repeats))


# -- host / reference side -----------------------------------------------------------------------

def host_sample(fn: Fn) -> float:
    """One sample of a host callable in ms (torch CUDA callables should use `cuda_sample`)."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def cuda_sample(fn: Fn) -> float:
    """One sample of a torch CUDA callable in ms, with CUDA events."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def time_pair(device_fn: Fn, ref_fn: Fn | None, repeats: int = 10, warmup: int = 2, cuda_ref: bool = False,
              target_ms: float = 20.0) -> tuple[float, float | None]:
    """Median ms of device_fn and ref_fn, run interleaved (A B A B) so neither gets a quiet machine alone."""
    ref_sample = cuda_sample if cuda_ref else host_sample
    for _ in range(warmup):
        device_fn()
        if ref_fn is not None:
            ref_fn()
    sample = _sampler(target_ms, device_fn)
    dev, ref = [], []
    for _ in range(repeats):
        dev.append(sample())
        if ref_fn is not None:
            ref.append(ref_sample(ref_fn))
    return float(statistics.median(dev)), (float(statistics.median(ref)) if ref else None)


# -- records -------------------------------------------------------------------------------------

def _rate(amount: float | None, ms: float | None, scale: float) -> float | None:
    if amount is None or not ms:
        return None
    return amount / (ms * 1e-3) / scale


def record(kernel: str, variant: str, shape: str, ms: float, flops: float | None = None,
           nbytes: float | None = None, ref: str | None = None, ref_ms: float | None = None,
           device: str | None = None, **extra: Any) -> dict:
    """The bench record: GFLOPS and GB/s from the FLOP and byte counts; ratio = ref_ms / ms (>1: helios faster)."""
    rec = {
        "event": "bench", "t": time.time(), "kernel": kernel, "variant": variant, "shape": shape,
        "ms": ms, "gflops": _rate(flops, ms, 1e9), "gbps": _rate(nbytes, ms, 1e9),
        "ref": ref, "ref_ms": ref_ms, "ref_gflops": _rate(flops, ref_ms, 1e9), "ref_gbps": _rate(nbytes, ref_ms, 1e9),
        "ratio": (ref_ms / ms) if (ref_ms and ms) else None,
        "device": device if device is not None else device_name(),
    }
    rec.update(extra)
    return rec


def compare(kernel: str, variant: str, shape: str, device_fn: Fn, ref_fn: Fn | None = None, ref: str | None = None,
            flops: float | None = None, nbytes: float | None = None, repeats: int = 10, warmup: int = 2,
            cuda_ref: bool = False, **extra: Any) -> dict:
    """Time device_fn against ref_fn (interleaved) and return the bench record."""
    ms, ref_ms = time_pair(device_fn, ref_fn, repeats=repeats, warmup=warmup, cuda_ref=cuda_ref)
    return record(kernel, variant, shape, ms, flops, nbytes, ref if ref_fn is not None else None, ref_ms, **extra)


def torch_reference():
    """(torch, on_cuda) for reference timings, or (None, False) where torch is not importable.

    TF32 is switched off so a CUDA reference computes the same float32 arithmetic we do.
    """
    try:
        import torch
    except ImportError:
        return None, False
    cuda = bool(torch.cuda.is_available())
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    else:
        torch.set_num_threads(max(1, os.cpu_count() or 1))
    return torch, cuda


def sweep_shapes(args, full: Sequence, quick: Sequence, gpu_extra: Sequence,
                 records: Callable[..., list[dict]]) -> list[dict]:
    """`records(rows, cols, rng, repeats, torch_cuda)` for each shape: `quick` or `full` (plus `gpu_extra` on a
    GPU); torch_cuda is the torch module where CUDA runs the reference, else None. One rng (seed 0) throughout."""
    import numpy as np

    info = _runtime().get_runtime().info
    shapes = list(quick if args.quick else full)
    if not info.is_cpu and not args.quick:
        shapes += gpu_extra
    torch, cuda = torch_reference() if not info.is_cpu else (None, False)
    rng = np.random.default_rng(0)
    out = []
    for rows, cols in shapes:
        out += records(rows, cols, rng, args.repeats, torch if cuda else None)
    return out


# -- output --------------------------------------------------------------------------------------

def _fmt(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


_COLUMNS = (("kernel", "s"), ("variant", "s"), ("shape", "s"), ("ms", ".3f"), ("gflops", ".1f"), ("gbps", ".1f"),
            ("ref", "s"), ("ref_ms", ".3f"), ("ref_gflops", ".1f"), ("ref_gbps", ".1f"), ("ratio", ".2f"))


def format_table(records: Sequence[dict]) -> str:
    """Records as an aligned text table (one row per record; '-' where a figure does not apply)."""
    rows = [[name for name, _ in _COLUMNS]]
    rows += [[_fmt(r.get(name), spec) for name, spec in _COLUMNS] for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(cell.ljust(w) if i < 3 or i == 6 else cell.rjust(w) for i, (cell, w) in
                       enumerate(zip(row, widths, strict=True))) for row in rows]
    if records:
        lines.append(f"device: {records[0].get('device')}")
    return "\n".join(lines)
