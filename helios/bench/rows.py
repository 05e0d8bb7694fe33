"""Row ops over the last axis, forward and backward: every row op spec (softmax, layernorm, rmsnorm, the reductions
sum, mean and max, which have no backward, ... from helios.kernels.contract.spec), vs numpy doing the same work (and
torch on CUDA where there is one); the column sums, sumsq and the column copies (forward only) beside them.

The numpy baselines work in float32 into preallocated arrays (no page faults): softmax max, subtract, exp,
sum, divide, and backward y * dy, row sums, dy - s, y * (.); the norms mean, centre, variance, rstd, scale
and shift, and backward g = dy * w, the two row means, dx and the column sums dw = sum(dy * xhat) and
db = sum(dy). A spec without a baseline here is timed against its own numpy reference (which allocates).
Bytes counted: the kernel's useful traffic (its `bytes`), for both columns. Shapes are [rows, cols]: attention
rows and model widths.
"""

from __future__ import annotations

import argparse
import functools

import numpy as np

from helios.bench import catalogue
from helios.bench.harness import compare, sweep_shapes

BENCH = catalogue.declare(__name__, families=("rows", "sum_rows", "reduce_all", "layout"), order=40)

FULL = [(2048, 256), (4096, 768), (4096, 1024), (1024, 4096), (1024, 4097)]
QUICK = [(1024, 256)]
GPU_EXTRA = [(65536, 1024), (16384, 4096)]
EPS = 1e-5  # the norms' default


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


def _softmax_baselines(args, saved, dy):
    (x,), (y,) = args, saved
    return numpy_softmax(x, np.empty_like(x)), numpy_softmax_backward(y, dy, np.empty_like(x))


def _norm_baselines(args, saved, dy):
    x, w, *bias = args  # RMSNorm: no bias, saves (x, w, rstd); LayerNorm saves (x, w, mean, rstd)
    mean = saved[2] if bias else None
    cols = x.shape[-1]
    db = np.empty(cols, np.float32) if bias else None
    return (numpy_layernorm(x, w, bias[0] if bias else None, np.empty_like(x)),
            numpy_layernorm_backward(x, w, mean, saved[-1], dy, np.empty_like(x), np.empty(cols, np.float32), db))


# (forward, backward) numpy baselines from (args, saved, dy), float32 arrays.
BASELINES = {"softmax": _softmax_baselines, "layernorm": _norm_baselines, "rmsnorm": _norm_baselines}


def _torch_forward(torch, name: str, args):
    """The torch CUDA forward of op `name`, or None where there is no comparison."""
    cx, *params = (torch.tensor(a, device="cuda") for a in args)
    if name == "softmax":
        return lambda: torch.softmax(cx, dim=-1)
    if name == "layernorm":
        return lambda: torch.nn.functional.layer_norm(cx, (cx.shape[-1],), *params, EPS)
    return None


def _records(rows: int, cols: int, rng: np.random.Generator, repeats: int, torch_cuda) -> list[dict]:
    import helios.runtime as rt
    from helios.kernels.contract.spec import specs
    from helios.kernels.lib import row_workers as rowlib

    shape, label, variant = (rows, cols), f"{rows}x{cols}", rowlib.choose(rows, cols)
    out = []
    for spec in specs("rows"):
        args = spec.inputs(rng, shape)
        targs = [rt.from_numpy(a) for a in args]
        saved = spec.saved(targs, spec.forward(*targs))
        dy = rng.standard_normal(shape, dtype=np.float32)
        tdy = rt.from_numpy(dy)
        host_saved = [s.numpy() for s in saved]
        fast = BASELINES.get(spec.name)
        ref_fwd, ref_bwd = fast(args, host_saved, dy) if fast else (
            functools.partial(spec.reference, *args),
            spec.reference_backward and functools.partial(spec.reference_backward, *host_saved, dy))
        fwd = dict(flops=spec.flops(shape), nbytes=spec.bytes(shape), repeats=repeats)
        device_fwd = functools.partial(spec.forward, *targs)
        out.append(compare(spec.name, variant, label, device_fwd, ref_fwd, ref="numpy", **fwd))
        if spec.backward is not None:  # the reductions over rows have none
            bwd = dict(flops=spec.flops(shape, kernel=1), nbytes=spec.bytes(shape, kernel=1), repeats=repeats)
            out.append(compare(f"{spec.name}_backward", variant, label, functools.partial(spec.backward, *saved, tdy),
                               ref_bwd, ref="numpy", **bwd))
        torch_fwd = _torch_forward(torch_cuda, spec.name, args) if torch_cuda is not None else None
        if torch_fwd is not None:
            out.append(compare(spec.name, variant, label, device_fwd, torch_fwd, ref="torch-cuda", cuda_ref=True,
                               **fwd))
    for spec in specs("sum_rows") + specs("reduce_all"):  # column sums and sumsq: forward only, at this shape
        args = spec.inputs(rng, shape)
        targs = [rt.from_numpy(a) for a in args]
        out.append(compare(spec.name, f"{spec.family} rule", label, functools.partial(spec.apply, spec.forward, targs),
                           functools.partial(spec.apply, spec.reference, args), ref="numpy",
                           flops=spec.flops(shape), nbytes=spec.bytes(shape), repeats=repeats))
    return out


def case_records(rng: np.random.Generator, repeats: int) -> list[dict]:
    """The column copies (concat, slice_columns, copy_columns: forward only) once each, at their largest test
    case (their scalars say which columns move, so the sweep's shapes do not fit them)."""
    import helios.runtime as rt
    from helios.kernels.contract.spec import specs

    out = []
    for spec in specs("layout"):
        k = max(range(len(spec.shapes)), key=lambda i: int(np.prod(spec.shapes[i])))
        scalars = spec.scalar_cases()[k % len(spec.scalar_cases())]
        shape = spec.shapes[k]
        args = spec.inputs(rng, shape, **scalars)
        targs = [rt.from_numpy(a) for a in args]
        out.append(compare(spec.name, f"{spec.family} rule", "x".join(map(str, shape)),
                           functools.partial(spec.apply, spec.forward, targs, **scalars),
                           functools.partial(spec.apply, spec.reference, args, **scalars), ref="numpy",
                           flops=spec.flops(shape), nbytes=spec.bytes(shape), repeats=repeats))
    return out


def run(args: argparse.Namespace) -> list[dict]:
    """Records for every row op spec (forward and backward where it has one) and the column sums and sumsq at each
    shape, then the column copies at their largest test cases."""
    return sweep_shapes(args, FULL, QUICK, GPU_EXTRA, _records) + case_records(np.random.default_rng(0), args.repeats)
