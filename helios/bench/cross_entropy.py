"""Fused softmax cross-entropy, derived from its op spec (helios.kernels.rows.cross_entropy): the spec's input generator
(targets with an ignored and an out-of-range row), its forward (loss and dlogits, all three dispatches) and its
backward (dlogits scaled on the device by the loss's incoming gradient), each vs numpy doing the same work (and the
forward against torch on CUDA where there is one).

The numpy baseline computes the same outputs into preallocated arrays: row max, exp, row sums, the row losses and
their mean, and dlogits = grad_scale * (softmax - onehot) / n_valid; its backward multiplies dlogits by the scalar
into a preallocated array. Bytes counted: logits read twice and dlogits written once (12 bytes per logit) forward,
dlogits read and written backward.
"""

from __future__ import annotations

import argparse

import numpy as np

from helios.bench import catalogue
from helios.bench.harness import compare, torch_reference

BENCH = catalogue.declare(__name__, families=("cross_entropy",), order=50)

FULL = [(1024, 4096), (4096, 517), (512, 50257)]
QUICK = [(256, 4096), (64, 50257)]
GPU_EXTRA = [(8192, 50257)]  # a GPT-2 batch; past lavapipe's 128 MiB binding limit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="two small shapes only")
    parser.add_argument("--repeats", type=int, default=10, help="timed samples per figure (median reported)")


def numpy_reference(logits: np.ndarray, targets: np.ndarray, ignore_index: int = -1, grad_scale: float = 1.0):
    """A callable computing (loss, dlogits) like the kernel, with preallocated buffers."""
    rows = np.arange(logits.shape[0])
    d = np.empty_like(logits)
    row_max = np.empty((logits.shape[0], 1), dtype=logits.dtype)
    sums = np.empty_like(row_max)

    def run():
        valid = (targets != ignore_index) & (targets >= 0) & (targets < logits.shape[1])
        n_valid = max(int(valid.sum()), 1)
        np.max(logits, axis=1, keepdims=True, out=row_max)
        np.subtract(logits, row_max, out=d)
        np.exp(d, out=d)
        np.sum(d, axis=1, keepdims=True, out=sums)
        safe = np.where(valid, targets, 0)
        loss = np.sum(np.where(valid, np.log(sums[:, 0]) + row_max[:, 0] - logits[rows, safe], 0.0)) / n_valid
        coef = np.where(valid, grad_scale / n_valid, 0.0).astype(logits.dtype)[:, None]
        np.multiply(d, coef / sums, out=d)
        d[rows, safe] = d[rows, safe] - coef[:, 0]
        return loss, d

    return run


def numpy_backward(loss_grad: np.ndarray, dloss: np.ndarray):
    """A callable computing dlogits = loss_grad * dloss[0] into a preallocated array."""
    out = np.empty_like(loss_grad)
    return lambda: np.multiply(loss_grad, dloss[0], out=out)


def records(shapes, rng: np.random.Generator, repeats: int, torch_cuda=None) -> list[dict]:
    """Per (rows, vocab): the forward and the backward against numpy, and the forward against torch_cuda (the
    torch module where CUDA runs the reference, else None)."""
    import helios.runtime as rt
    from helios.kernels.contract import selection
    from helios.kernels.contract.spec import spec_of
    from helios.kernels.rows.cross_entropy import flops, nbytes

    spec = spec_of("cross_entropy")
    out = []
    for n, vocab in shapes:
        host = spec.inputs(rng, (n, vocab))
        logits, targets = host
        args = [rt.from_numpy(x) for x in host]
        saved = spec.saved(args, spec.apply(spec.forward, args))
        dloss = rng.standard_normal(1, dtype=np.float32)
        tdloss = rt.from_numpy(dloss)
        shape, variant = f"{n}x{vocab}", selection.choose("cross_entropy", (n, vocab)).variant
        forward = dict(flops=flops(n, vocab), nbytes=nbytes(n, vocab), repeats=repeats)

        def device_fn(args=args):
            spec.apply(spec.forward, args)

        out.append(compare("cross_entropy", variant, shape, device_fn, numpy_reference(logits, targets), ref="numpy",
                           **forward))
        out.append(compare("cross_entropy_backward", "elementwise rule", shape,
                           lambda saved=saved, tdloss=tdloss: spec.backward(*saved, tdloss),
                           numpy_backward(saved[0].numpy(), dloss), ref="numpy", flops=n * vocab,
                           nbytes=8 * n * vocab, repeats=repeats))
        if torch_cuda is not None:
            tl = torch_cuda.tensor(logits, device="cuda", requires_grad=True)
            tgt = torch_cuda.tensor(np.where((targets >= 0) & (targets < vocab), targets, -1),
                                    dtype=torch_cuda.long, device="cuda")

            def torch_fn(tl=tl, tgt=tgt):
                loss = torch_cuda.nn.functional.cross_entropy(tl, tgt, ignore_index=-1)
                torch_cuda.autograd.grad(loss, tl)

            out.append(compare("cross_entropy", variant, shape, device_fn, torch_fn, ref="torch-cuda", cuda_ref=True,
                               **forward))
        del args, saved, tdloss
    return out


def run(args: argparse.Namespace) -> list[dict]:
    """The records of `records` at the quick or full shapes (plus a GPT-2 batch on a GPU that can bind it)."""
    import helios.runtime as rt

    info = rt.get_runtime().info
    shapes = QUICK if args.quick else FULL
    if not info.is_cpu and not args.quick:
        shapes = shapes + [s for s in GPU_EXTRA if s[0] * s[1] * 4 <= info.max_storage_buffer_range]
    torch, cuda = torch_reference()
    return records(shapes, np.random.default_rng(0), args.repeats, torch if cuda else None)
