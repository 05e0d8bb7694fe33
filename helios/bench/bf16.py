"""bf16 vs fp32 for the bandwidth-bound kernels (elementwise maps, and the row kernels layernorm, softmax and
cross-entropy over rows of 768): the same op on the same device, both dtypes
timed interleaved (A B A B). bf16 moves 2 bytes per operand element instead of 4 and computes in f32, so on a
memory-bound kernel the ideal is 2x. Each record's `ratio` is fp32 ms / bf16 ms (>1: bf16 faster), `gbps` the
bf16 side's useful traffic and `ref_gbps` the fp32 side's.
"""

from __future__ import annotations

import argparse
import statistics

import ml_dtypes
import numpy as np

from helios.bench import catalogue
from helios.bench.harness import _sampler, record

BENCH = catalogue.declare(__name__, why="dtype pairs of kernels the others time")

FULL = [1 << 20, 1 << 22]
QUICK = [1 << 20]
BF16 = np.dtype(ml_dtypes.bfloat16)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=10, help="timed samples per figure (median reported)")
    parser.add_argument("--quick", action="store_true", help="1M elements only")


ROW = 768  # the row kernels' width (GPT-2 small's n_embd)


def _ops(n: int, dtype):
    """(name, fp32 bytes moved, launch) for each op on fresh tensors of `dtype`."""
    import helios.runtime as rt
    from helios import ops
    from helios.kernels.contract.spec import spec_of
    from helios.kernels.pointwise import dropout as D
    from helios.kernels.pointwise import elementwise as E
    from helios.kernels.pointwise import fused as F

    rng = np.random.default_rng(0)
    a, b, c = (rt.from_numpy(rng.standard_normal(n).astype(np.float32).astype(dtype)) for _ in range(3))
    rows = n // ROW
    x, dy = a.view(0, (rows, ROW)), b.view(0, (rows, ROW))
    w, bias = (rt.from_numpy(rng.standard_normal(ROW).astype(np.float32).astype(dtype)) for _ in range(2))
    targets = rt.from_numpy(rng.integers(0, ROW, rows).astype(np.int32))
    row_bytes = 2 * rows * ROW * 4  # read x, write y (or dlogits); the f32 per-row statistics are ~0.1% more
    maps = [
        ("add", E.ADD, lambda: ops.add(a, b)),
        ("scale", E.SCALE, lambda: ops.scale(a, 0.5)),
        ("add_inplace", E.ADD_INPLACE, lambda: ops.add_inplace(c, b, 0.5)),
        ("gelu", spec_of("gelu").kernels[0], lambda: ops.gelu(a)),
        ("gelu_backward", spec_of("gelu").kernels[1], lambda: ops.gelu_backward(a, b)),
        ("swiglu", F.SWIGLU, lambda: ops.swiglu(a, b)),
        ("dropout", D.DROPOUT, lambda: ops.dropout(a, 0.1, 1, 0)),
        ("residual_dropout_add", F.RESIDUAL_DROPOUT_ADD, lambda: ops.residual_dropout_add(a, b, 0.1, 1, 0)),
    ]
    return [(name, kernel.bytes(n), fn) for name, kernel, fn in maps] + [
        ("layernorm", row_bytes, lambda: ops.layernorm(x, w, bias, 1e-5)),
        ("softmax", row_bytes, lambda: ops.softmax(x)),
        ("softmax_backward", 3 * rows * ROW * 4, lambda: ops.softmax_backward(x, dy)),
        ("cross_entropy", row_bytes, lambda: ops.cross_entropy(x, targets)),
    ]


def run(args: argparse.Namespace) -> list[dict]:
    sizes = QUICK if getattr(args, "quick", False) else FULL
    repeats = getattr(args, "repeats", 10)
    records = []
    for n in sizes:
        for (name, nbytes, f32_fn), (_, _, bf16_fn) in zip(_ops(n, np.float32), _ops(n, BF16), strict=True):
            for fn in (f32_fn, bf16_fn):  # warm: pipelines built, pool regions carved
                fn()
            f32_sample, bf16_sample = _sampler(20.0, f32_fn), _sampler(20.0, bf16_fn)
            f32_ms, bf16_ms = [], []
            for _ in range(repeats):
                f32_ms.append(f32_sample())
                bf16_ms.append(bf16_sample())
            f32, bf = statistics.median(f32_ms), statistics.median(bf16_ms)
            rec = record(name, "bf16", f"n={n}", bf, None, nbytes / 2, "fp32", f32)
            rec["ref_gbps"] = nbytes / (f32 * 1e-3) / 1e9  # the fp32 side moves twice the bytes
            records.append(rec)
    return records
