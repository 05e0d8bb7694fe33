"""The device's peak fp32 FLOP/s, for MFU, and where the figure came from.

A device helios knows by name gets its vendor's figure. Any other is measured with the FMA limit kernel: the
best of several short rounds, so that one round slowed by another job on the machine does not count, and
the best figure so far is kept in the cache directory's limits.json (beside what `python -m helios.bench
limits` stores). A run whose MFU would pass 100% measures again (`remeasure`): the stored figure was taken
while the machine was busy.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass

from helios.env import cache_dir, cache_problem

LIMITS_FILE = "limits.json"

# Vendor fp32 (non-tensor-core, boost clock) peaks in TFLOP/s, by a pattern of the name Vulkan reports; the
# first match wins, so a variant comes before its family.
VENDOR_FP32_TFLOPS: tuple[tuple[str, float], ...] = (
    (r"\bH100\b.*\bPCIe\b", 51.2), (r"\bH100\b", 66.9), (r"\bH200\b", 66.9), (r"\bGH200\b", 66.9),
    (r"\bA100\b", 19.5), (r"\bA10\b", 31.2), (r"\bL40S\b", 91.6), (r"\bL40\b", 90.5), (r"\bL4\b", 30.3),
    (r"\bV100\b", 15.7), (r"\bT4\b", 8.1), (r"\bRTX 4090\b", 82.6), (r"\bRTX 3090\b", 35.6),
    (r"\bMI300X\b", 81.7), (r"\bMI250X\b", 47.9),
)


@dataclass(frozen=True)
class Peak:
    """A peak fp32 throughput and a few words on where it came from (shown beside MFU)."""

    flops: float
    source: str


def vendor_peak(device_name: str) -> Peak | None:
    """The vendor's fp32 figure for a device helios knows by name, else None."""
    for pattern, tflops in VENDOR_FP32_TFLOPS:
        if re.search(pattern, device_name):
            return Peak(tflops * 1e12, f"the vendor's fp32 figure for {device_name}")
    return None


def stored_fma_gflops(device_name: str) -> float | None:
    """The FMA peak recorded for this device (by the bench or an earlier measurement), if any."""
    try:
        entry = json.loads((cache_dir() / LIMITS_FILE).read_text()).get(device_name)
    except (OSError, ValueError, AttributeError):
        return None
    value = entry.get("fma_gflops") if isinstance(entry, dict) else None
    return float(value) if value else None


def store_limits(device_name: str, **best: float) -> bool:
    """Keep the higher of each figure (fma_gflops, copy_gbps) and any earlier one in limits.json; False when the
    cache directory cannot be written (the figure then lives only as long as this process)."""
    if cache_problem() is not None:
        return False
    path = cache_dir() / LIMITS_FILE
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    table = table if isinstance(table, dict) else {}
    entry = table.get(device_name) if isinstance(table.get(device_name), dict) else {}
    for key, value in best.items():
        entry[key] = max(value, float(entry.get(key) or 0.0))
    table[device_name] = entry
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{LIMITS_FILE}.")
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(table, indent=1))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError:  # a disk that filled up since the probe: the cache is only an optimisation
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return False
    return True


def store_fma_gflops(device_name: str, gflops: float) -> bool:
    """Record a measured FMA peak (keeping the higher of this and any earlier figure)."""
    return store_limits(device_name, fma_gflops=gflops)


def measure_fma_gflops(rounds: int = 5, round_s: float = 0.2) -> float:
    """FMA throughput: the best dispatch of the limit kernel over `rounds` short rounds a moment apart, so a
    burst of load from another process lowers some rounds but not the figure."""
    from helios import runtime as rt
    from helios.ceilings import kernels as L
    from helios.device import get_device

    info = get_device().info
    threads, n = L.fma_size(info.is_cpu)
    variant = "fma8"
    out = rt.empty(threads)
    L.fma_run(threads, n, variant, out=out)  # compile and warm up
    rt.sync()
    flops = L.fma_flops(threads, n, L.LIMITS_FMA.variant(variant).chains)
    best = 0.0
    for k in range(rounds):
        if k:
            time.sleep(round_s / 2)  # let a competing job's burst pass before the next round
        t_end = time.perf_counter() + round_s
        while True:
            t0 = time.perf_counter()
            L.fma_run(threads, n, variant, out=out)
            rt.sync()
            seconds = time.perf_counter() - t0
            best = max(best, flops / seconds / 1e9)
            if time.perf_counter() > t_end:
                break
    return best


def known_peak(device_name: str) -> Peak | None:
    """The vendor's figure or a stored measurement, without measuring (None when neither exists)."""
    vendor = vendor_peak(device_name)
    if vendor is not None:
        return vendor
    gflops = stored_fma_gflops(device_name)
    if gflops is None:
        return None
    return Peak(gflops * 1e9, f"the FMA kernel's best measured on this device ({cache_dir() / LIMITS_FILE})")


def device_peak(device_name: str) -> Peak:
    """The device's peak fp32 FLOP/s: the vendor's figure, the stored measurement, or one measured now (about a
    second) and stored for next time."""
    known = known_peak(device_name)
    return known if known is not None else _measured(device_name, 0.0, "measured now")


def remeasure(device_name: str, previous: Peak) -> Peak:
    """A run's MFU passed 100% of `previous`: measure again and keep the higher figure (a measurement taken while
    another job loaded the machine is too low)."""
    return _measured(device_name, previous.flops / 1e9, "re-measured because MFU passed 100%")


def _measured(device_name: str, floor_gflops: float, how: str) -> Peak:
    gflops = max(measure_fma_gflops(), floor_gflops)
    stored = store_fma_gflops(device_name, gflops)
    where = f"stored in {cache_dir() / LIMITS_FILE}" if stored else "not stored: the cache directory is not writable"
    return Peak(gflops * 1e9, f"the FMA kernel, {how} (best of 5 rounds; {where})")

