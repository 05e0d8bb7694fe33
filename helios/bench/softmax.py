"""Softmax over the last axis, forward and backward, vs numpy doing the same work (and torch on CUDA where
there is one).

The numpy references write into preallocated arrays (no page faults) in float32: forward max, subtract,
exp, sum, divide; backward y * dy, row sums, dy - s, y * (.). Bytes counted: the kernel's useful traffic,
8 per element forward (read x, write y) and 12 backward (read y and dy, write dx), for both columns.
Shapes are [rows, cols] of attention-like rows.
"""

from __future__ import annotations

import argparse

import numpy as np

from helios.bench.harness import compare, sweep_shapes

FULL = [(2048, 256), (4096, 1024), (1024, 4096), (1024, 4097)]
QUICK = [(1024, 256)]
GPU_EXTRA = [(65536, 1024), (16384, 4096)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="one small shape only")
    parser.add_argument("--repeats", type=int, default=10, help="timed samples per figure (median reported)")


def numpy_softmax(x: np.ndarray, y: np.ndarray):
    """A callable computing softmax(x) into y with preallocated temporaries."""
    m = np.empty(x.shape[:-1] + (1,), np.float32)
    s = np.empty_like(m)

    def run():
        np.max(x, axis=-1, keepdims=True, out=m)
        np.subtract(x, m, out=y)
        np.exp(y, out=y)
        np.sum(y, axis=-1, keepdims=True, out=s)
        np.divide(y, s, out=y)

    return run


def numpy_softmax_backward(y: np.ndarray, dy: np.ndarray, dx: np.ndarray):
    s = np.empty(y.shape[:-1] + (1,), np.float32)

    def run():
        np.multiply(y, dy, out=dx)
        np.sum(dx, axis=-1, keepdims=True, out=s)
        np.subtract(dy, s, out=dx)
        np.multiply(y, dx, out=dx)

    return run


def _records(rows: int, cols: int, rng: np.random.Generator, repeats: int, torch_cuda) -> list[dict]:
    import helios.runtime as rt
    from helios.kernels import rows as rowlib
    from helios.kernels.softmax import SOFTMAX, SOFTMAX_BACKWARD, reference, softmax, softmax_backward

    x = rng.standard_normal((rows, cols), dtype=np.float32) * 3
    dy = rng.standard_normal((rows, cols), dtype=np.float32)
    y = reference(x).astype(np.float32)
    tx, ty, tdy = rt.from_numpy(x), rt.from_numpy(y), rt.from_numpy(dy)
    ty_out, tdx_out = rt.empty(x.shape), rt.empty(x.shape)
    shape, variant = f"{rows}x{cols}", rowlib.choose(rows, cols)
    out = [
        compare("softmax", variant, shape, lambda: softmax(tx, out=ty_out), numpy_softmax(x, np.empty_like(x)),
                ref="numpy", flops=SOFTMAX.flops(rows, cols), nbytes=SOFTMAX.bytes(rows, cols), repeats=repeats),
        compare("softmax_backward", variant, shape, lambda: softmax_backward(ty, tdy, out=tdx_out),
                numpy_softmax_backward(y, dy, np.empty_like(x)), ref="numpy",
                flops=SOFTMAX_BACKWARD.flops(rows, cols), nbytes=SOFTMAX_BACKWARD.bytes(rows, cols), repeats=repeats),
    ]
    if torch_cuda is not None:
        torch = torch_cuda
        cx = torch.tensor(x, device="cuda")
        out.append(compare("softmax", variant, shape, lambda: softmax(tx, out=ty_out),
                           lambda: torch.softmax(cx, dim=-1), ref="torch-cuda", cuda_ref=True,
                           flops=SOFTMAX.flops(rows, cols), nbytes=SOFTMAX.bytes(rows, cols), repeats=repeats))
    return out


def run(args: argparse.Namespace) -> list[dict]:
    """Records for softmax and softmax_backward at each shape."""
    return sweep_shapes(args, FULL, QUICK, GPU_EXTRA, _records)
