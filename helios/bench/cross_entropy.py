"""Fused softmax cross-entropy (loss + dlogits, all three dispatches) vs numpy doing the same work.

The numpy reference computes the same outputs into preallocated arrays: row max, exp, row sums, the
row losses and their mean, and dlogits = grad_scale * (softmax - onehot) / n_valid. Bytes counted: logits
read twice and dlogits written once (12 bytes per logit).
"""

from __future__ import annotations

import argparse

import numpy as np

from helios.bench.harness import compare, torch_reference

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


def run(args: argparse.Namespace) -> list[dict]:
    """One record per shape (and one more against torch on CUDA where there is a CUDA GPU)."""
    import helios.runtime as rt
    from helios.kernels import selection
    from helios.kernels.cross_entropy import cross_entropy, flops, nbytes

    info = rt.get_runtime().info
    shapes = QUICK if args.quick else FULL
    if not info.is_cpu and not args.quick:
        shapes = shapes + [s for s in GPU_EXTRA if s[0] * s[1] * 4 <= info.max_storage_buffer_range]
    repeats = args.repeats
    torch, cuda = torch_reference()
    records = []
    rng = np.random.default_rng(0)
    for n, vocab in shapes:
        logits = rng.standard_normal((n, vocab), dtype=np.float32)
        targets = rng.integers(0, vocab, size=n).astype(np.int32)
        targets[::7] = -1
        lt, tt = rt.from_numpy(logits), rt.from_numpy(targets)
        shape = f"{n}x{vocab}"
        variant = selection.choose("cross_entropy", (n, vocab)).variant

        def device_fn(lt=lt, tt=tt):
            cross_entropy(lt, tt)

        records.append(compare("cross_entropy", variant, shape, device_fn, numpy_reference(logits, targets),
                               ref="numpy", flops=flops(n, vocab), nbytes=nbytes(n, vocab), repeats=repeats))
        if cuda:
            tl = torch.tensor(logits, device="cuda", requires_grad=True)
            tgt = torch.tensor(targets, dtype=torch.long, device="cuda")

            def torch_fn(tl=tl, tgt=tgt):
                loss = torch.nn.functional.cross_entropy(tl, tgt, ignore_index=-1)
                torch.autograd.grad(loss, tl)

            records.append(compare("cross_entropy", variant, shape, device_fn, torch_fn, ref="torch-cuda",
                                   flops=flops(n, vocab), nbytes=nbytes(n, vocab), repeats=repeats, cuda_ref=True))
        del lt, tt
    return records
