"""LayerNorm and RMSNorm over the last axis, forward and backward (dx, dw and db into a gradient arena), vs
numpy doing the same work (and torch on CUDA where there is one).

The numpy references work in float32 into preallocated arrays: forward mean, centre, variance, rstd,
scale and shift; backward g = dy * w, the two row means, dx, and the column sums dw = sum(dy * xhat) and
db = sum(dy). Bytes counted: the kernel's useful traffic, 8 per element forward (read x, write y) and 12
backward (read x and dy, write dx), for both columns. Shapes are [tokens, model width].
"""

from __future__ import annotations

import argparse

import numpy as np

from helios.bench.harness import compare, sweep_shapes
from helios.spirv import ceil_div

FULL = [(2048, 256), (4096, 768), (1024, 4096), (1024, 4097)]
QUICK = [(1024, 256)]
GPU_EXTRA = [(65536, 1024), (16384, 4096)]
EPS = 1e-5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="one small shape only")
    parser.add_argument("--repeats", type=int, default=10, help="timed samples per figure (median reported)")


def numpy_layernorm(x, w, b, y):
    """A callable computing LayerNorm(x) into y (b None: RMSNorm) with preallocated temporaries."""
    m = np.empty(x.shape[:-1] + (1,), np.float32)
    r = np.empty_like(m)
    t = np.empty_like(x)

    def run():
        if b is not None:
            np.mean(x, axis=-1, keepdims=True, out=m)
            np.subtract(x, m, out=t)
        else:
            np.copyto(t, x)
        np.multiply(t, t, out=y)
        np.mean(y, axis=-1, keepdims=True, out=r)
        np.add(r, EPS, out=r)
        np.sqrt(r, out=r)
        np.divide(1.0, r, out=r)
        np.multiply(t, r, out=t)
        np.multiply(t, w, out=y)
        if b is not None:
            np.add(y, b, out=y)

    return run


def numpy_layernorm_backward(x, w, mean, rstd, dy, dx, dw, db):
    """A callable computing dx, dw (and db unless db is None: RMSNorm, mean None) like the kernels."""
    m, r = (None if mean is None else mean[:, None]), rstd[:, None]
    xhat, g = np.empty_like(x), np.empty_like(x)
    c = np.empty(x.shape[:-1] + (1,), np.float32)

    def run():
        if m is not None:
            np.subtract(x, m, out=xhat)
            np.multiply(xhat, r, out=xhat)
        else:
            np.multiply(x, r, out=xhat)
        np.multiply(dy, w, out=g)
        np.multiply(g, xhat, out=dx)
        np.mean(dx, axis=-1, keepdims=True, out=c)
        np.multiply(xhat, c, out=dx)
        np.subtract(g, dx, out=dx)
        if m is not None:
            np.mean(g, axis=-1, keepdims=True, out=c)
            np.subtract(dx, c, out=dx)
        np.multiply(dx, r, out=dx)
        np.multiply(dy, xhat, out=g)
        np.sum(g, axis=0, out=dw)
        if db is not None:
            np.sum(dy, axis=0, out=db)

    return run


def _records(rows: int, cols: int, rng: np.random.Generator, repeats: int, torch_cuda) -> list[dict]:
    import helios.runtime as rt
    from helios.kernels import norms as N
    from helios.kernels import rows as rowlib

    x = rng.standard_normal((rows, cols), dtype=np.float32) * 2 + 1
    w = rng.standard_normal(cols, dtype=np.float32)
    b = rng.standard_normal(cols, dtype=np.float32)
    dy = rng.standard_normal((rows, cols), dtype=np.float32)
    tx, tw, tb, tdy = (rt.from_numpy(a) for a in (x, w, b, dy))
    arena = rt.zeros((3 * ceil_div(cols, 64) * 64,))  # gradients land in views of one arena, as in training
    pad = arena.numel // 3
    dw_out, db_out, dg_out = (arena.view(k * pad, (cols,)) for k in range(3))
    _, mean, rstd = N.layernorm(tx, tw, tb, EPS)
    _, rstd_rms = N.rmsnorm(tx, tw, EPS)
    _, rmean, rrstd = N.reference_layernorm(x, w, b, EPS)
    _, rrstd_rms = N.reference_rmsnorm(x, w, EPS)
    rmean, rrstd, rrstd_rms = (a.astype(np.float32) for a in (rmean, rrstd, rrstd_rms))
    shape, variant = f"{rows}x{cols}", rowlib.choose(rows, cols)
    fwd = dict(flops=N.LAYERNORM.flops(rows, cols), nbytes=N.LAYERNORM.bytes(rows, cols), repeats=repeats)
    bwd = dict(flops=N.LAYERNORM_BACKWARD.flops(rows, cols), nbytes=N.LAYERNORM_BACKWARD.bytes(rows, cols),
               repeats=repeats)
    tmp = [np.empty_like(x) for _ in range(2)]
    cw, cb = np.empty(cols, np.float32), np.empty(cols, np.float32)

    def ln_fwd():
        N.layernorm(tx, tw, tb, EPS)

    def ln_bwd():
        N.layernorm_backward(tx, tw, mean, rstd, tdy, dw_out=dw_out, db_out=db_out, accumulate=True)

    def rms_fwd():
        N.rmsnorm(tx, tw, EPS)

    def rms_bwd():
        N.rmsnorm_backward(tx, tw, rstd_rms, tdy, dw_out=dg_out, accumulate=True)

    out = [
        compare("layernorm", variant, shape, ln_fwd, numpy_layernorm(x, w, b, tmp[0]), ref="numpy", **fwd),
        compare("layernorm_backward", variant, shape, ln_bwd,
                numpy_layernorm_backward(x, w, rmean, rrstd, dy, tmp[1], cw, cb), ref="numpy", **bwd),
        compare("rmsnorm", variant, shape, rms_fwd, numpy_layernorm(x, w, None, tmp[0]), ref="numpy", **fwd),
        compare("rmsnorm_backward", variant, shape, rms_bwd,
                numpy_layernorm_backward(x, w, None, rrstd_rms, dy, tmp[1], cw, None), ref="numpy", **bwd),
    ]
    if torch_cuda is not None:
        torch = torch_cuda
        cx, cwt, cbt = (torch.tensor(a, device="cuda") for a in (x, w, b))
        out.append(compare("layernorm", variant, shape, ln_fwd,
                           lambda: torch.nn.functional.layer_norm(cx, (cols,), cwt, cbt, EPS),
                           ref="torch-cuda", cuda_ref=True, **fwd))
    return out


def run(args: argparse.Namespace) -> list[dict]:
    """Records for layernorm and rmsnorm, forward and backward, at each shape."""
    return sweep_shapes(args, FULL, QUICK, GPU_EXTRA, _records)
