"""The device's peak fp32 FLOP/s, for MFU: measured once per device (a second or two with the FMA limit kernel)
and kept in the cache directory's limits.json, beside what `python -m helios.bench limits` stores."""

from __future__ import annotations

import json
import time

from helios.env import cache_dir

LIMITS_FILE = "limits.json"


def stored_fma_gflops(device_name: str) -> float | None:
    """The FMA peak recorded for this device (by the bench or an earlier measurement), if any."""
    try:
        entry = json.loads((cache_dir() / LIMITS_FILE).read_text()).get(device_name)
    except (OSError, ValueError, AttributeError):
        return None
    value = entry.get("fma_gflops") if isinstance(entry, dict) else None
    return float(value) if value else None


def store_fma_gflops(device_name: str, gflops: float) -> None:
    """Record a measured FMA peak (keeping the higher of this and any earlier figure)."""
    path = cache_dir() / LIMITS_FILE
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    entry = table.get(device_name, {})
    entry["fma_gflops"] = max(gflops, entry.get("fma_gflops", 0.0))
    table[device_name] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{time.monotonic_ns()}.tmp")
    tmp.write_text(json.dumps(table, indent=1))
    tmp.replace(path)


def measure_fma_gflops(budget_s: float = 1.0) -> float:
    """A quick FMA-throughput measurement: the best of a few dispatches of the limit kernel."""
    from helios import runtime as rt
    from helios.device import get_device
    from helios.kernels import limits as L

    info = get_device().info
    threads = 64 * 64 if info.is_cpu else 1 << 20
    n = 100 if info.is_cpu else 2000
    variant = "fma8"
    out = rt.empty(threads)
    L.fma_run(threads, n, variant, out=out)  # compile and warm up
    rt.sync()
    flops = L.fma_flops(threads, n, L.LIMITS_FMA.variant(variant).chains)
    best, t_end = 0.0, time.perf_counter() + budget_s
    while True:
        t0 = time.perf_counter()
        L.fma_run(threads, n, variant, out=out)
        rt.sync()
        seconds = time.perf_counter() - t0
        best = max(best, flops / seconds / 1e9)
        if time.perf_counter() > t_end or seconds > budget_s:
            return best


def peak_flops(device_name: str) -> float:
    """The device's peak fp32 FLOP/s: the stored figure, or one measured now and stored for next time."""
    gflops = stored_fma_gflops(device_name)
    if gflops is None:
        gflops = measure_fma_gflops()
        store_fma_gflops(device_name, gflops)
    return gflops * 1e9
