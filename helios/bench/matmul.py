"""Matmul vs numpy and torch.matmul in one dtype: squares 256-2048 and the GPT-small linear-layer shapes.

Shapes are MxNxK (C[M, N] = A[M, K] @ B[K, N]); `--layouts` adds the transposed forms training uses (nt:
x @ W^T, tn: dY^T @ X). `--dtype fp32|bf16|fp16` sets a, b and C (f32 accumulation): the op's choice in that
dtype runs (the matrix units' cooperative-matrix tilings for bf16/fp16 where the device has them, else the
stored tuning winner or table) unless `--variant` names a tiling (or "all": every tiling of the device's family,
the matrix units' too for half dtypes). References: numpy (fp32 only, interleaved with the device runs) and
torch.matmul in the same dtype (on CUDA when available, TF32 off, timed with CUDA events; on the CPU otherwise,
in the full run only).
"""

from __future__ import annotations

import argparse

import numpy as np

from helios.bench.harness import device_name, record, time_pair, torch_reference

SQUARES = [(n, n, n) for n in (256, 512, 1024, 2048)]
GPT = [(2048, 1152, 384), (2048, 1536, 384), (2048, 384, 1536)]  # qkv / mlp-up / mlp-down, B*T = 2048
QUICK = [(256, 256, 256), (512, 512, 512), (2048, 1152, 384)]
DTYPES = {"fp32": "f32", "f32": "f32", "bf16": "bf16", "fp16": "fp16"}  # --dtype -> kernel dtype name


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """"MxNxK,MxNxK" -> [(M, N, K), ...]."""
    shapes = []
    for part in text.split(","):
        dims = [int(d) for d in part.lower().split("x")]
        if len(dims) != 3 or min(dims) < 1:
            raise argparse.ArgumentTypeError(f"shape {part!r} is not MxNxK")
        shapes.append(tuple(dims))
    return shapes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a subset that runs in under a minute on lavapipe")
    parser.add_argument("--shapes", type=parse_shapes, help="MxNxK,... instead of the default shapes")
    parser.add_argument("--layouts", default="nn", help="comma-separated of nn, nt, tn, tt (default nn)")
    parser.add_argument("--variant", help="a tiling (reg8x16, tiled128, cm64, ...) or 'all'; default: the op's choice")
    parser.add_argument("--repeats", type=int, default=None, help="timed samples per figure (median)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32",
                        help="dtype of a, b and C, and of the torch reference (default fp32; numpy is fp32 only)")
    parser.add_argument("--cpu", action="store_true",
                        help="also report process CPU ms per call (cpu_ms, gflop_per_cpu_s): on a CPU device such as "
                             "lavapipe this is steadier than wall time when other processes share the cores")


def _host(layout: str, M: int, N: int, K: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((K, M) if layout[0] == "t" else (M, K), dtype=np.float32)
    b = rng.standard_normal((N, K) if layout[1] == "t" else (K, N), dtype=np.float32)
    return a, b


def _numpy_ref(layout: str, a: np.ndarray, b: np.ndarray):
    at = a.T if layout[0] == "t" else a
    bt = b.T if layout[1] == "t" else b
    out = np.empty((at.shape[0], bt.shape[1]), np.float32)
    return lambda: np.matmul(at, bt, out=out)


def _torch_ref(torch, cuda: bool, layout: str, a: np.ndarray, b: np.ndarray, dtype: str = "f32"):
    tdtype = {"f32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    ta, tb = (torch.from_numpy(x.astype(np.float32)).to(tdtype) for x in (a, b))  # numpy bf16 goes through f32
    if cuda:
        ta, tb = ta.cuda(), tb.cuda()
    at = ta.T if layout[0] == "t" else ta
    bt = tb.T if layout[1] == "t" else tb
    out = torch.empty((at.shape[0], bt.shape[1]), dtype=tdtype, device=ta.device)
    return lambda: torch.matmul(at, bt, out=out)


def tilings(which: str | None, dtype: str = "f32") -> list[str | None]:
    """The tilings to time: [None] (the op's choice), one named tiling, or the device family's ("all"; for half
    dtypes also the cooperative-matrix tilings the device runs)."""
    from helios.device import get_device
    from helios.kernels import matmul_coopmat as coopmat
    from helios.kernels import matmul_select as sel

    if which is None:
        return [None]
    if which == "all":
        info = get_device().info
        suffix = coopmat.EMULATED if info.cooperative_matrix_emulated else ""
        matrix = [t + suffix for t in coopmat.TILINGS if coopmat.runs(info, dtype, t + suffix)]
        return list(sel.device_tilings(info)) + matrix
    return [which]


def cpu_ms(fn, repeats: int) -> float:
    """Median process CPU time (all threads, lavapipe's workers included) of fn plus a sync, in ms."""
    import statistics
    import time

    import helios.runtime as rt

    samples = []
    for _ in range(repeats):
        rt.sync()
        t0 = time.process_time()
        fn()
        rt.sync()
        samples.append((time.process_time() - t0) * 1e3)
    return statistics.median(samples)


def bench_shape(layout: str, M: int, N: int, K: int, tiling: str | None, repeats: int, torch_mod, cuda: bool,
                with_numpy: bool = True, cpu: bool = False, dtype: str = "f32") -> list[dict]:
    """Records for one shape and tiling in dtype: helios vs numpy (f32 only), and vs torch when torch_mod is given.
    The record's variant is what ran (a forced tiling this device cannot run gives way to the table)."""
    import helios.runtime as rt
    from helios.kernels import matmul as mm
    from helios.kernels import selection
    from helios.kernels.dtypes import NUMPY

    a, b = _host(layout, M, N, K)
    if dtype != "f32":
        a, b = a.astype(NUMPY[dtype]), b.astype(NUMPY[dtype])
    ta, tb = rt.from_numpy(a), rt.from_numpy(b)
    c = rt.empty((M, N), NUMPY[dtype])
    trans = {"trans_a": layout[0] == "t", "trans_b": layout[1] == "t"}
    selection.force("matmul", tiling)
    try:
        variant = mm.variant_name(layout, M, N, K, 1, dtype=dtype)

        def device_fn():
            mm.matmul(ta, tb, out=c, **trans)

        refs = []
        if with_numpy and dtype == "f32":
            refs.append(("numpy", _numpy_ref(layout, a, b), False))
        if torch_mod is not None:
            name = ("torch-cuda" if cuda else "torch") + ("" if dtype == "f32" else f"-{dtype}")
            refs.append((name, _torch_ref(torch_mod, cuda, layout, a, b, dtype), cuda))
        out, dev = [], device_name()
        io_bytes = 4 if dtype == "f32" else 2
        for ref_name, ref_fn, on_cuda in refs or [(None, None, False)]:
            ms, ref_ms = time_pair(device_fn, ref_fn, repeats=repeats, warmup=1, cuda_ref=on_cuda)
            out.append(record(f"matmul_{layout}", variant, f"{M}x{N}x{K}", ms, mm.flops(M, N, K),
                              mm.nbytes(M, N, K, io_bytes=io_bytes), ref_name, ref_ms, device=dev))
        if cpu:
            c_ms = cpu_ms(device_fn, repeats)
            for r in out:
                r.update(cpu_ms=c_ms, gflop_per_cpu_s=mm.flops(M, N, K) / (c_ms * 1e6))
        return out
    finally:
        selection.force("matmul", None)


def format_records(records: list[dict]) -> str:
    """The harness table, plus the CPU-time columns when measured."""
    from helios.bench.harness import format_table

    text = format_table(records)
    if records and "cpu_ms" in records[0]:
        text += "\ncpu time per call: " + "; ".join(
            f"{r['kernel'][7:]} {r['shape']} {r['cpu_ms']:.1f} ms ({r['gflop_per_cpu_s']:.2f} GFLOP/cpu-s)"
            for r in records if r.get("ref") in ("numpy", None))
    return text


def run(args) -> list[dict]:
    shapes = args.shapes or (QUICK if args.quick else SQUARES + GPT)
    repeats = args.repeats or (3 if args.quick else 5)
    torch_mod, cuda = torch_reference()
    if torch_mod is not None and args.quick and not cuda:
        torch_mod = None  # the CPU torch reference doubles the run time; numpy is the CPU reference
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    dtype = DTYPES[getattr(args, "dtype", "fp32")]
    records = []
    for layout in layouts:
        for M, N, K in shapes:
            for tiling in tilings(args.variant, dtype):
                records.extend(bench_shape(layout, M, N, K, tiling, repeats, torch_mod, cuda, cpu=args.cpu,
                                           dtype=dtype))
    return records
