"""Device limits: FMA throughput (GFLOPS) and copy bandwidth (GB/s, bytes read + written), the ceilings every
other figure can be read against. References: numpy's copy on the host, or torch's copy on CUDA.
"""

from __future__ import annotations

import argparse

import numpy as np

from helios.bench import catalogue
from helios.bench.harness import compare, device_name, torch_reference

BENCH = catalogue.declare(__name__, order=10)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="smaller runs")
    parser.add_argument("--repeats", type=int, default=None, help="timed samples per figure (median)")


def run(args) -> list[dict]:
    import helios.runtime as rt
    from helios.ceilings import kernels as L
    from helios.device import get_device

    info = get_device().info
    repeats = args.repeats or (3 if args.quick else 7)
    dev = device_name()
    records = []
    threads, n = L.fma_size(info.is_cpu, 200 if args.quick else 1000)
    out = rt.empty(threads)
    for variant in L.LIMITS_FMA.variants:
        chains = L.LIMITS_FMA.variant(variant).chains
        records.append(compare("limits_fma", variant, f"{threads}x{n}",
                               lambda v=variant: L.fma_run(threads, n, v, out=out),
                               flops=L.fma_flops(threads, n, chains), repeats=repeats, device=dev))
    size = (1 << 22 if args.quick else 1 << 24) if info.is_cpu else 1 << 26
    host = np.random.default_rng(0).standard_normal(size, dtype=np.float32)
    x, y = rt.from_numpy(host), rt.empty(size)
    torch, cuda = torch_reference()
    if cuda:
        tx = torch.from_numpy(host).cuda()
        ty = torch.empty_like(tx)
        ref_name, ref_fn = "torch-cuda", lambda: ty.copy_(tx)
    else:
        dst = np.empty_like(host)
        ref_name, ref_fn = "numpy", lambda: np.copyto(dst, host)
    for variant in L.LIMITS_COPY.variants:
        records.append(compare("limits_copy", variant, f"{size}", lambda v=variant: L.copy_run(x, y, v), ref_fn,
                               ref_name, nbytes=8 * size, repeats=repeats, cuda_ref=cuda, device=dev))
    store_peaks(info.name, records)
    return records


def store_peaks(device: str, records: list[dict]) -> bool:
    """Keep this device's best FMA and copy figures in the cache dir: the trainer's MFU reads the FMA peak.
    False when the cache directory cannot be written."""
    from helios.ceilings.peak import store_limits

    fma = [r["gflops"] for r in records if r["kernel"] == "limits_fma" and r.get("gflops")]
    copy = [r["gbps"] for r in records if r["kernel"] == "limits_copy" and r.get("gbps")]
    best = {"fma_gflops": max(fma)} if fma else {}
    if copy:
        best["copy_gbps"] = max(copy)
    return store_limits(device, **best)
