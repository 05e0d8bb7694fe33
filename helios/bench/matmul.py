"""SGEMM (float32 matmul) vs numpy and torch.matmul: squares 256-2048 and the GPT-small linear-layer shapes.

Shapes are MxNxK (C[M, N] = A[M, K] @ B[K, N]); `--layouts` adds the transposed forms training uses (nt:
x @ W^T, tn: dY^T @ X). The variant is the one the op would choose (stored tuning winner or table) unless
`--variant` names a tiling (or "all": every tiling of the device's family). References: numpy (float32,
interleaved with the device runs) and torch.matmul (on CUDA when available, TF32 off, timed with CUDA
events; on the CPU otherwise, in the full run only).

`--dtype bf16` (or fp16) times the half-precision matmul instead (a and b and C in that dtype, f32
accumulation) beside the f32 one of the same tiling, run interleaved: the reference column is then
"helios-f32" (its GFLOP/s) and ratio = f32 ms / half ms (>1: the half matmul is faster).
"""

from __future__ import annotations

import argparse

import numpy as np

from helios.bench.harness import device_name, record, time_pair, torch_reference

SQUARES = [(n, n, n) for n in (256, 512, 1024, 2048)]
GPT = [(2048, 1152, 384), (2048, 1536, 384), (2048, 384, 1536)]  # qkv / mlp-up / mlp-down, B*T = 2048
QUICK = [(256, 256, 256), (512, 512, 512), (2048, 1152, 384)]


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
    parser.add_argument("--variant", help="a tiling (reg8x16, tiled128, ...) or 'all'; default: the op's choice")
    parser.add_argument("--repeats", type=int, default=None, help="timed samples per figure (median)")
    parser.add_argument("--dtype", choices=("f32", "bf16", "fp16"), default="f32",
                        help="operand dtype; bf16/fp16 are timed beside f32 (default f32: vs numpy/torch)")
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


def _torch_ref(torch, cuda: bool, layout: str, a: np.ndarray, b: np.ndarray):
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    if cuda:
        ta, tb = ta.cuda(), tb.cuda()
    at = ta.T if layout[0] == "t" else ta
    bt = tb.T if layout[1] == "t" else tb
    out = torch.empty((at.shape[0], bt.shape[1]), dtype=torch.float32, device=ta.device)
    return lambda: torch.matmul(at, bt, out=out)


def tilings(which: str | None) -> list[str | None]:
    """The tilings to time: [None] (the op's choice), one named tiling, or the device family's ("all")."""
    from helios.device import get_device
    from helios.kernels import matmul_select as sel

    if which is None:
        return [None]
    if which == "all":
        return list(sel.device_tilings(get_device().info))
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
                with_numpy: bool = True, cpu: bool = False) -> list[dict]:
    """Records for one shape and tiling: helios vs numpy, and vs torch when torch_mod is given."""
    import helios.runtime as rt
    from helios.kernels import matmul as mm
    from helios.kernels import selection

    a, b = _host(layout, M, N, K)
    ta, tb = rt.from_numpy(a), rt.from_numpy(b)
    c = rt.empty((M, N))
    trans = {"trans_a": layout[0] == "t", "trans_b": layout[1] == "t"}
    variant = mm.variant_name(layout, M, N, K, 1, tiling)
    selection.force("matmul", tiling)
    try:
        def device_fn():
            mm.matmul(ta, tb, out=c, **trans)

        refs = []
        if with_numpy:
            refs.append(("numpy", _numpy_ref(layout, a, b), False))
        if torch_mod is not None:
            refs.append(("torch-cuda" if cuda else "torch", _torch_ref(torch_mod, cuda, layout, a, b), cuda))
        out, dev = [], device_name()
        for ref_name, ref_fn, on_cuda in refs or [(None, None, False)]:
            ms, ref_ms = time_pair(device_fn, ref_fn, repeats=repeats, warmup=1, cuda_ref=on_cuda)
            out.append(record(f"matmul_{layout}", variant, f"{M}x{N}x{K}", ms, mm.flops(M, N, K),
                              mm.nbytes(M, N, K), ref_name, ref_ms, device=dev))
        if cpu:
            c = cpu_ms(device_fn, repeats)
            for r in out:
                r.update(cpu_ms=c, gflop_per_cpu_s=mm.flops(M, N, K) / (c * 1e6))
        return out
    finally:
        selection.force("matmul", None)


def bench_half(layout: str, M: int, N: int, K: int, tiling: str | None, repeats: int, dtype: str) -> dict:
    """The record of one shape's half matmul (dtype a, b and C), with the f32 matmul of the same tiling as its
    reference, the two timed interleaved (A B A B) so neither gets a quiet machine alone."""
    import statistics

    import helios.runtime as rt
    from helios.bench.harness import time_device
    from helios.kernels import matmul as mm
    from helios.kernels import selection
    from helios.kernels.dtypes import NUMPY

    a, b = _host(layout, M, N, K)
    trans = {"trans_a": layout[0] == "t", "trans_b": layout[1] == "t"}
    f32 = (rt.from_numpy(a), rt.from_numpy(b), rt.empty((M, N)))
    half = (rt.from_numpy(a.astype(NUMPY[dtype])), rt.from_numpy(b.astype(NUMPY[dtype])),
            rt.empty((M, N), NUMPY[dtype]))
    selection.force("matmul", tiling)
    try:
        fns = [lambda t=t: mm.matmul(t[0], t[1], out=t[2], **trans) for t in (half, f32)]
        for fn in fns:  # warm up: pipelines built and JIT-compiled before any timing
            fn()
        samples = [[time_device(fn, repeats=1, warmup=0) for fn in fns] for _ in range(repeats)]
        ms, f32_ms = (statistics.median(col) for col in zip(*samples, strict=True))
        variant = mm.variant_name(layout, M, N, K, 1, tiling, dtype=dtype)
        return record(f"matmul_{layout}", variant, f"{M}x{N}x{K}", ms, mm.flops(M, N, K),
                      mm.nbytes(M, N, K, io_bytes=2), "helios-f32", f32_ms, device=device_name())
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
    dtype = getattr(args, "dtype", "f32")
    records = []
    for layout in layouts:
        for M, N, K in shapes:
            for tiling in tilings(args.variant):
                if dtype != "f32":
                    records.append(bench_half(layout, M, N, K, tiling, repeats, dtype))
                    continue
                records.extend(bench_shape(layout, M, N, K, tiling, repeats, torch_mod, cuda, cpu=args.cpu))
    return records
