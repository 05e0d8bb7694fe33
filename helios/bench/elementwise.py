"""Elementwise kernels (add, bias add, swiglu, dropout, add_inplace, and every pointwise op spec's forward and
backward: exp, gelu, ... from helios.kernels.contract.spec) vs numpy doing the same work at 1M-16M elements (and vs
torch on the same GPU, 1M-64M elements, where CUDA is available).

The numpy references write into preallocated arrays (`out=`), so they pay no page faults, and use float32
throughout; multi-pass references (gelu, swiglu, dropout) use preallocated temporaries (other op specs: their
own numpy reference, which allocates). Bytes counted: 4 per
element of every operand read or written once (the kernel's `bytes`), also for the reference, so the two
GB/s columns compare the same useful traffic.
"""

from __future__ import annotations

import argparse
import functools

import numpy as np

from helios.bench import catalogue
from helios.bench.harness import compare

BENCH = catalogue.declare(__name__, rest=True, order=30)

FULL = [1 << 20, 1 << 22, 1 << 24]
QUICK = [1 << 20]
GPU_EXTRA = [1 << 26]
COLS = 768  # bias-add rows: a GPT-2-small width


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=10, help="timed samples per figure (median reported)")
    parser.add_argument("--quick", action="store_true", help="1M elements only")


def _numpy_gelu(x, out, t):
    """0.5 x (1 + tanh(k0 (x + k1 x^3))) with two temporaries, float32."""
    from helios.kernels.pointwise.activations import GELU_K0, GELU_K1

    k0, k1 = np.float32(GELU_K0), np.float32(GELU_K1)

    def run():
        np.multiply(x, x, out=t)
        np.multiply(t, k1, out=t)
        np.add(t, 1, out=t)
        np.multiply(t, x, out=t)
        np.multiply(t, k0, out=t)
        np.tanh(t, out=t)
        np.add(t, 1, out=t)
        np.multiply(t, x, out=out)
        np.multiply(out, 0.5, out=out)

    return run


def _numpy_gelu_backward(x, dy, out, t, u):
    from helios.kernels.pointwise.activations import GELU_K0, GELU_K1

    k0, k1 = np.float32(GELU_K0), np.float32(GELU_K1)

    def run():
        np.multiply(x, x, out=u)  # x^2
        np.multiply(u, k1, out=t)
        np.add(t, 1, out=t)
        np.multiply(t, x, out=t)
        np.multiply(t, k0, out=t)
        np.tanh(t, out=t)  # t
        np.multiply(u, 3 * k1, out=u)
        np.add(u, 1, out=u)
        np.multiply(u, k0, out=u)  # du
        np.multiply(u, x, out=u)
        np.multiply(t, t, out=out)
        np.subtract(1, out, out=out)
        np.multiply(out, u, out=out)  # x (1 - t^2) du
        np.add(out, t, out=out)
        np.add(out, 1, out=out)
        np.multiply(out, 0.5, out=out)
        np.multiply(out, dy, out=out)

    return run


def _numpy_swiglu(gate, up, out, t):
    def run():
        np.negative(gate, out=t)
        np.exp(t, out=t)
        np.add(t, 1, out=t)
        np.divide(gate, t, out=out)
        np.multiply(out, up, out=out)

    return run


def _numpy_dropout(x, out, u, p: float):
    gen = np.random.default_rng(0)
    scale = np.float32(1 / (1 - p))

    def run():
        gen.random(out=u, dtype=np.float32)
        np.multiply(x, scale, out=out)
        out[u < p] = 0.0

    return run


def _torch_cases(torch, a, b, bias, rows: int) -> dict:
    """Reference callables with torch on the GPU, keyed like the helios cases."""
    import torch.nn.functional as tf

    ta, tb, tbias = (torch.from_numpy(x).cuda() for x in (a, b, bias))
    out = torch.empty_like(ta)
    ta2, out2 = ta[: rows * COLS].view(rows, COLS), out[: rows * COLS].view(rows, COLS)
    return {
        "add": lambda: torch.add(ta, tb, out=out),
        "add_bias": lambda: torch.add(ta2, tbias, out=out2),
        "gelu": lambda: tf.gelu(ta, approximate="tanh"),
        "gelu_backward": lambda: torch.ops.aten.gelu_backward(tb, ta, approximate="tanh"),
        "swiglu": lambda: tf.silu(ta) * tb,
        "dropout": lambda: tf.dropout(ta, 0.1, training=True),
        "add_inplace": lambda: ta.add_(tb, alpha=1e-3),
    }


def _records(n: int, repeats: int, torch) -> list[dict]:
    """Records for one size (its device tensors are freed when this returns)."""
    import helios.runtime as rt
    from helios.kernels.contract import selection
    from helios.kernels.contract.device_paths import dtype_unmet
    from helios.kernels.contract.spec import specs
    from helios.kernels.pointwise import elementwise as E

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    rows = n // COLS
    bias = rng.standard_normal(COLS, dtype=np.float32)
    out, t, u = np.empty_like(a), np.empty_like(a), np.empty_like(a)
    ta, tb, tbias = rt.from_numpy(a), rt.from_numpy(b), rt.from_numpy(bias)
    ta2 = ta.view(0, (rows, COLS))
    a2, out2 = a[: rows * COLS].reshape(rows, COLS), out[: rows * COLS].reshape(rows, COLS)
    cases = [
        ("add", E.ADD, n, lambda: E.add(ta, tb), lambda: np.add(a, b, out=out)),
        ("add_bias", E.ADD, rows * COLS, lambda: E.add(ta2, tbias), lambda: np.add(a2, bias, out=out2)),
        ("add_inplace", E.ADD_INPLACE, n, lambda: E.add_inplace(ta, tb, 1e-3),
         lambda: np.add(a, np.float32(1e-3) * b, out=a)),
    ]
    # Every op spec's forward and backward, derived from its declaration: numpy runs the spec's reference
    # (allocating) unless a preallocated in-place baseline is written for that op below.
    fast = {"gelu": _numpy_gelu(a, out, t), "gelu_backward": _numpy_gelu_backward(a, b, out, t, u),
            "swiglu": _numpy_swiglu(a, b, out, t)}
    # Specs of other families without a bench of their own (rope) run here too, on n // 1024 rows of their input
    # generator's width, labelled with their family (their rule picks the variant). Not here: the families another
    # benchmark module declares (helios.bench.catalogue), e.g. cross_entropy, embedding (ids and tables at model
    # shapes), attention, whose sizes are scalars (benched at model shapes), and matmul (every dtype against torch).
    # masked_fill's int mask comes from its spec's input generator like any input.
    labels = {}
    hand = {case[0] for case in cases}  # add and add_inplace have preallocated numpy baselines above
    benched_elsewhere = catalogue.benched_elsewhere(BENCH.name)
    for spec in [s for s in specs() if s.family not in benched_elsewhere and s.name not in hand]:
        kw = spec.scalar_cases()[0]  # an op's scalar arguments (clamp's bounds, softcap's cap): its first test case
        if "p" in kw:  # the dropout ops: their first test case whose probability draws a mask
            kw = next(k for k in spec.scalar_cases() if 0 < k["p"] < 1)
        if spec.dtype_scalar:  # cast: its first result dtype the device stores (f32 without 16-bit storage)
            kw = next(k for k in spec.scalar_cases() if not dtype_unmet(rt.get_runtime().info, k[spec.dtype_scalar]))
        if spec.name == "dropout":
            fast["dropout"] = _numpy_dropout(a, out, u, kw["p"])
        host = spec.inputs(rng, (n,) if spec.family == "elementwise" else (n // 1024, 1024), **kw)
        if spec.family != "elementwise":
            labels[spec.name] = labels[f"{spec.name}_backward"] = f"{spec.family} rule"
        count = host[0].size
        targs = [rt.from_numpy(x) for x in host]
        fwd_kernel = spec.kernels[0]
        cases.append((spec.name, fwd_kernel, count, functools.partial(spec.forward, *targs, **kw),
                      fast.get(spec.name, functools.partial(spec.reference, *host, **kw))))
        if spec.backward is None:  # a forward-only op (sub, cast, ...)
            continue
        saved = spec.saved(targs, spec.forward(*targs, **kw))
        host_saved = [s.numpy() for s in saved]
        grad_kw = spec.grad_kwargs(kw)
        dy = b if count == n else rng.standard_normal(host[0].shape, dtype=np.float32)
        tdy = tb if count == n else rt.from_numpy(dy)
        bwd_kernel = spec.kernels[1]
        backward = functools.partial(spec.backward, *saved, tdy, **grad_kw)
        cases.append((f"{spec.name}_backward", bwd_kernel, count, backward,
                      fast.get(f"{spec.name}_backward",
                               functools.partial(spec.reference_backward, *host_saved, dy, **grad_kw))))
    torch_refs = _torch_cases(torch, a, b, bias, rows) if torch is not None else {}
    records = []
    for name, kernel, count, device_fn, ref_fn in cases:
        bcast = "row" if name == "add_bias" else "full"
        variant = labels.get(name) or selection.choose("elementwise", (count, bcast, COLS))
        nbytes = kernel.bytes(count) - (4 * count if bcast == "row" else 0)  # the bias row stays cached
        shape = f"{rows}x{COLS}" if bcast == "row" else str(count)
        common = dict(flops=kernel.flops(count), nbytes=nbytes, repeats=repeats)
        records.append(compare(name, variant, shape, device_fn, ref_fn, ref="numpy", **common))
        if name in torch_refs:
            records.append(compare(name, variant, shape, device_fn, torch_refs[name], ref="torch-cuda",
                                   cuda_ref=True, **common))
    return records


def run(args: argparse.Namespace) -> list[dict]:
    """One record per kernel and size against numpy, plus one against torch CUDA where it is available."""
    import helios.runtime as rt
    from helios.bench.harness import torch_reference

    info = rt.get_runtime().info
    quick = getattr(args, "quick", False)
    sizes = QUICK if quick else FULL
    torch, cuda = torch_reference() if not info.is_cpu else (None, False)
    if not info.is_cpu and not quick:
        sizes = sizes + [n for n in GPU_EXTRA if 4 * n <= info.max_storage_buffer_range]
    repeats = getattr(args, "repeats", 10)
    records = []
    for n in sizes:
        records += _records(n, repeats, torch if cuda else None)
    return records
