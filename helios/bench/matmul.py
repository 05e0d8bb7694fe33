"""Matmul vs numpy and torch.matmul in one dtype: squares 256-2048 and the GPT-small linear-layer shapes, derived
from the matmul op spec (helios.kernels.matmul): its input generator lays a and b out as the layout says, its forward
runs C = op(a) @ op(b), and with `--backward` its backward (dA and dB, one product each, as training runs them).

Shapes are MxNxK (C[M, N] = A[M, K] @ B[K, N]); `--layouts` adds the transposed forms training uses (nt:
x @ W^T, tn: dY^T @ X). `--dtype fp32|bf16|fp16` sets a, b and C (f32 accumulation): the op's choice in that
dtype runs (the matrix units' cooperative-matrix tilings for bf16/fp16 where the device has them, else the
stored tuning winner or table) unless `--variant` names a tiling (or "all": every tiling of the device's family,
the matrix units' too for half dtypes). References: numpy (fp32 only, interleaved with the device runs) and
torch.matmul in the same dtype (on CUDA when available, TF32 off, timed with CUDA events; on the CPU otherwise,
in the full run only), each doing the same products into preallocated arrays. A record's `kernel` is the forward's
kernel (matmul_nn, ...; "matmul_<layout>_backward" for the backward) and its `op` the spec's op.
"""

from __future__ import annotations

import argparse

import numpy as np

from helios.bench import catalogue
from helios.bench.harness import device_name, record, time_pair, torch_reference

BENCH = catalogue.declare(__name__, families=("matmul",), order=80)

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
    from helios.kernels.matmul.select import BLOCKS  # the tilings --variant names

    parser.add_argument("--quick", action="store_true", help="a subset that runs in under a minute on lavapipe")
    parser.add_argument("--shapes", type=parse_shapes, help="MxNxK,... instead of the default shapes")
    parser.add_argument("--layouts", default="nn", help="comma-separated of nn, nt, tn, tt (default nn)")
    parser.add_argument("--variant", help=f"a tiling ({', '.join(BLOCKS)}) or 'all'; default: the op's choice")
    parser.add_argument("--repeats", type=int, default=None, help="timed samples per figure (median)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32",
                        help="dtype of a, b and C, and of the torch reference (default fp32; numpy is fp32 only)")
    parser.add_argument("--backward", action="store_true",
                        help="also time the backward (dA and dB: two products of the other layouts) per shape")
    parser.add_argument("--cpu", action="store_true",
                        help="also report process CPU ms per call (cpu_ms, gflop_per_cpu_s): on a CPU device such as "
                             "lavapipe this is steadier than wall time when other processes share the cores")


def _host(layout: str, M: int, N: int, K: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """a and b of an MxNxK product in `layout`, from the matmul spec's input generator."""
    from helios.kernels.contract.spec import spec_of

    return spec_of("matmul").inputs(np.random.default_rng(seed), (M, N, K), trans_a=layout[0] == "t",
                                    trans_b=layout[1] == "t")


def _products(layout: str, a, b, dc, backward: bool, swap, empty) -> list:
    """The (x, y, out) products of one pass, in any array library: forward op(a) @ op(b); backward dC op(b)^T and
    op(a)^T dC (dA and dB, in op() layout: the same work as the kernels' transposed stores)."""
    at = swap(a) if layout[0] == "t" else a
    bt = swap(b) if layout[1] == "t" else b
    pairs = [(dc, swap(bt)), (swap(at), dc)] if backward else [(at, bt)]
    return [(x, y, empty(x.shape[0], y.shape[1])) for x, y in pairs]


def _numpy_ref(layout: str, a: np.ndarray, b: np.ndarray, dc: np.ndarray | None = None):
    products = _products(layout, a, b, dc, dc is not None, np.transpose,
                         lambda m, n: np.empty((m, n), np.float32))
    return lambda: [np.matmul(x, y, out=out) for x, y, out in products]


def _torch_ref(torch, cuda: bool, layout: str, a: np.ndarray, b: np.ndarray, dtype: str = "f32",
               dc: np.ndarray | None = None):
    tdtype = {"f32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    dev = "cuda" if cuda else "cpu"
    ta, tb, tdc = (None if x is None else torch.from_numpy(x.astype(np.float32)).to(device=dev, dtype=tdtype)
                   for x in (a, b, dc))  # numpy bf16 goes through f32
    products = _products(layout, ta, tb, tdc, dc is not None, lambda x: x.T,
                         lambda m, n: torch.empty((m, n), dtype=tdtype, device=dev))
    return lambda: [torch.matmul(x, y, out=out) for x, y, out in products]


def tilings(which: str | None, dtype: str = "f32") -> list[str | None]:
    """The tilings to time: [None] (the op's choice), one named tiling, or the device family's ("all"; for half
    dtypes also the cooperative-matrix tilings the device runs)."""
    from helios.device import get_device
    from helios.kernels.matmul import coopmat
    from helios.kernels.matmul import select as sel

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
                with_numpy: bool = True, cpu: bool = False, dtype: str = "f32", backward: bool = False) -> list[dict]:
    """Records for one shape and tiling in dtype: the spec's forward (and backward) vs numpy (f32 only), and vs
    torch when torch_mod is given. The record's variant is what ran (a forced tiling this device cannot run gives
    way to the table; the backward's products choose for their own layouts, so it says which tiling was asked)."""
    import helios.runtime as rt
    from helios.kernels import matmul as mm
    from helios.kernels.contract import selection
    from helios.kernels.contract.dtypes import NUMPY
    from helios.kernels.contract.spec import spec_of

    spec = spec_of("matmul")
    a, b = _host(layout, M, N, K)
    dc = np.random.default_rng(1).standard_normal((M, N), dtype=np.float32) if backward else None
    if dtype != "f32":
        a, b = a.astype(NUMPY[dtype]), b.astype(NUMPY[dtype])
        dc = None if dc is None else dc.astype(NUMPY[dtype])
    ta, tb = rt.from_numpy(a), rt.from_numpy(b)
    c = rt.empty((M, N), NUMPY[dtype])
    trans = {"trans_a": layout[0] == "t", "trans_b": layout[1] == "t"}
    tdc = None if dc is None else rt.from_numpy(dc)
    selection.force("matmul", tiling)
    try:
        passes = [("", mm.variant_name(layout, M, N, K, 1, dtype=dtype),
                   lambda: spec.apply(spec.forward, [ta, tb], out=c, **trans), None, 1)]
        if backward:
            passes.append(("_backward", tiling or "matmul rule", lambda: spec.backward(ta, tb, tdc, **trans),
                           dc, 2))
        out, dev = [], device_name()
        io_bytes = 4 if dtype == "f32" else 2
        for suffix, variant, device_fn, pass_dc, products in passes:
            refs = []
            if with_numpy and dtype == "f32":
                refs.append(("numpy", _numpy_ref(layout, a, b, pass_dc), False))
            if torch_mod is not None:
                name = ("torch-cuda" if cuda else "torch") + ("" if dtype == "f32" else f"-{dtype}")
                refs.append((name, _torch_ref(torch_mod, cuda, layout, a, b, dtype, pass_dc), cuda))
            flops = products * spec.flops((M, N, K))
            nbytes = products * mm.nbytes(M, N, K, io_bytes=io_bytes)
            for ref_name, ref_fn, on_cuda in refs or [(None, None, False)]:
                ms, ref_ms = time_pair(device_fn, ref_fn, repeats=repeats, warmup=1, cuda_ref=on_cuda)
                out.append(record(f"matmul_{layout}{suffix}", variant, f"{M}x{N}x{K}", ms, flops, nbytes, ref_name,
                                  ref_ms, device=dev, op=spec.name + suffix))
            if cpu:
                c_ms = cpu_ms(device_fn, repeats)
                for r in out[-len(refs or [None]):]:
                    r.update(cpu_ms=c_ms, gflop_per_cpu_s=flops / (c_ms * 1e6))
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
                                           dtype=dtype, backward=args.backward))
    return records
