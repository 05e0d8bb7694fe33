"""Fused flash attention (causal, MHA) forward and forward+backward vs unfused references, derived from the
flash_attention op spec (helios.kernels.attention): its input generator (a fused qkv), its forward and its backward
with the scalars a shape fixes (B, T, head counts, head dim). Records `attention_forward` (op flash_attention) and
`attention_forward_backward` (op flash_attention_backward: the backward needs the forward's o and lse, and torch's
SDPA times them together, so both sides run forward then backward).

References, each timed interleaved with the fused kernels: numpy doing the unfused sequence in float32
(QK^T, scale, mask, softmax, PV and their backwards, materialising B x H x T x T), torch's
scaled_dot_product_attention (on CUDA when there is one), and helios's own unfused sequence (batched
matmul, masked_fill, softmax and their backwards, on per-head q/k/v prepared outside the timing, which
favours it). FLOPs: 4 B H T^2 D / 2 forward, 2.5x that backward (FlashAttention's convention; the
recomputation is not counted). Extra fields: `mem_mb` (the fused kernels' O(B H T D) working set) and
`ref_mem_mb` (the B H T T score and probability matrices the unfused sequences hold).
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from helios.bench import catalogue
from helios.bench.harness import compare, torch_reference

BENCH = catalogue.declare(__name__, families=("attention",), order=90)

FULL = [(8, 8, 256, 48), (4, 8, 512, 64)]  # (B, H, T, D)
QUICK = [(2, 4, 128, 48)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="one small shape only")
    parser.add_argument("--repeats", type=int, default=5, help="timed samples per figure (median reported)")
    parser.add_argument("--variant", default=None, help="force a kernel variant (rowwise, tiled)")
    parser.add_argument("--no-helios-unfused", action="store_true", help="skip helios's unfused sequence")


def numpy_unfused(qkv: np.ndarray, do: np.ndarray, B: int, H: int, T: int, D: int):
    """(forward, forward+backward) callables of the unfused float32 sequence in numpy."""
    x = qkv.reshape(B, T, 3, H, D)
    q, k, v = (np.ascontiguousarray(x[:, :, i].transpose(0, 2, 1, 3)) for i in range(3))
    dO = np.ascontiguousarray(do.reshape(B, T, H, D).transpose(0, 2, 1, 3))
    masked = ~np.tril(np.ones((T, T), dtype=bool))
    scale = np.float32(1.0 / math.sqrt(D))
    dqkv = np.empty((B, T, 3, H, D), np.float32)

    def forward():
        s = np.matmul(q, k.transpose(0, 1, 3, 2))
        s *= scale
        s[:, :, masked] = -np.inf
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        o = np.matmul(s, v)
        return s, o.transpose(0, 2, 1, 3).reshape(B, T, H * D)

    def forward_backward():
        p, _ = forward()
        dv = np.matmul(p.transpose(0, 1, 3, 2), dO)
        dp = np.matmul(dO, v.transpose(0, 1, 3, 2))
        dp -= (dp * p).sum(axis=-1, keepdims=True)
        dp *= p
        dp *= scale
        dqkv[:, :, 0] = np.matmul(dp, k).transpose(0, 2, 1, 3)
        dqkv[:, :, 1] = np.matmul(dp.transpose(0, 1, 3, 2), q).transpose(0, 2, 1, 3)
        dqkv[:, :, 2] = dv.transpose(0, 2, 1, 3)

    return forward, forward_backward


def torch_sdpa(torch, cuda: bool, qkv: np.ndarray, do: np.ndarray, B: int, H: int, T: int, D: int):
    """(forward, forward+backward) callables of torch's scaled_dot_product_attention (causal)."""
    dev = "cuda" if cuda else "cpu"
    x = torch.tensor(qkv, device=dev).view(B, T, 3, H, D)
    q, k, v = (x[:, :, i].transpose(1, 2).contiguous().requires_grad_(True) for i in range(3))
    g = torch.tensor(do, device=dev).view(B, T, H, D).transpose(1, 2).contiguous()
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def forward():
        with torch.no_grad():
            return sdpa(q, k, v, is_causal=True)

    def forward_backward():
        o = sdpa(q, k, v, is_causal=True)
        torch.autograd.backward(o, g)

    return forward, forward_backward


def helios_unfused(qkv: np.ndarray, do: np.ndarray, B: int, H: int, T: int, D: int):
    """(forward, forward+backward) of helios's unfused ops, or None where they are not there yet."""
    try:
        import helios.runtime as rt
        from helios.kernels.matmul import matmul
        from helios.kernels.pointwise.elementwise import masked_fill
        from helios.kernels.rows.softmax import softmax, softmax_backward
    except ImportError:
        return None
    x = qkv.reshape(B, T, 3, H, D)
    q, k, v = (rt.from_numpy(np.ascontiguousarray(x[:, :, i].transpose(0, 2, 1, 3)).reshape(B * H, T, D))
               for i in range(3))
    dO = rt.from_numpy(np.ascontiguousarray(do.reshape(B, T, H, D).transpose(0, 2, 1, 3)).reshape(B * H, T, D))
    mask = rt.from_numpy(np.broadcast_to(~np.tril(np.ones((T, T), dtype=bool)), (B * H, T, T)).astype(np.float32))
    scale = 1.0 / math.sqrt(D)

    def forward():
        s = masked_fill(matmul(q, k, trans_b=True, alpha=scale), mask, float("-inf"))
        p = softmax(s)
        return p, matmul(p, v)

    def forward_backward():
        p, _ = forward()
        matmul(p, dO, trans_a=True)  # dV
        ds = softmax_backward(p, matmul(dO, v, trans_b=True))
        matmul(ds, k, alpha=scale)  # dQ
        matmul(ds, q, trans_a=True, alpha=scale)  # dK

    return forward, forward_backward


def fused(spec, tq, tdo, B: int, H: int, T: int, D: int):
    """(forward, forward+backward) callables of the spec's fused kernels on device tensors (causal, MHA)."""
    from helios.kernels.attention import shape_scalars

    scalars = {"causal": True, **shape_scalars((B, T, H, H, D))}

    def forward():
        return spec.apply(spec.forward, [tq], **scalars)

    def forward_backward():
        outs = forward()
        spec.backward(*spec.saved([tq], outs), tdo, **spec.grad_kwargs(scalars))

    return forward, forward_backward


def records(shapes, rng: np.random.Generator, repeats: int, variant: str | None = None, with_torch: bool = True,
            with_helios_unfused: bool = True) -> list[dict]:
    """Forward and forward+backward records per (B, H, T, D), against numpy's unfused sequence, torch's SDPA
    (with_torch, where torch is there) and helios's unfused ops (with_helios_unfused), the variant forced if named."""
    import helios.runtime as rt
    from helios.kernels import attention as A
    from helios.kernels.attention.backward import backward_flops
    from helios.kernels.contract import selection
    from helios.kernels.contract.spec import spec_of

    selection.force("attention", variant)
    try:
        chosen = selection.choose("attention", (64,))
        torch, cuda = torch_reference() if with_torch else (None, False)
        spec = spec_of("flash_attention")
        out = []
        for B, H, T, D in shapes:
            (qkv,) = spec.inputs(rng, (B, T, H, H, D))
            do = rng.standard_normal((B, T, H * D)).astype(np.float32)
            tq, tdo = rt.from_numpy(qkv), rt.from_numpy(do)
            fwd, fwd_bwd = fused(spec, tq, tdo, B, H, T, D)
            refs = {"numpy_unfused": numpy_unfused(qkv, do, B, H, T, D)}
            if torch is not None:
                refs["torch_sdpa_cuda" if cuda else "torch_sdpa_cpu"] = torch_sdpa(torch, cuda, qkv, do, B, H, T, D)
            helios_ref = helios_unfused(qkv, do, B, H, T, D) if with_helios_unfused else None
            shape = f"B{B} H{H} T{T} D{D}"
            f_flops = A.attention_flops(B, T, H, D)
            mem = (qkv.nbytes + 2 * do.nbytes + 3 * B * H * T * 4) / 2 ** 20  # qkv, o, do, lse, delta
            ref_mem = 2 * B * H * T * T * 4 / 2 ** 20
            for name, op, dev_fn, flops, idx in (("attention_forward", spec.name, fwd, f_flops, 0),
                                                 ("attention_forward_backward", f"{spec.name}_backward", fwd_bwd,
                                                  f_flops + backward_flops(B, T, H, D), 1)):
                for ref, fns in refs.items():
                    out.append(compare(name, chosen, shape, dev_fn, fns[idx], ref=ref, flops=flops, repeats=repeats,
                                       warmup=1, cuda_ref=ref.endswith("cuda"), mem_mb=mem, ref_mem_mb=ref_mem,
                                       op=op))
                if helios_ref is not None:
                    # both sides run on the device: time them one after the other, each with timestamps
                    out.append(compare(name, chosen, shape, dev_fn, None, flops=flops, repeats=repeats, warmup=1,
                                       mem_mb=mem, op=op))
                    unfused = compare(name + "_unfused", "helios", shape, helios_ref[idx], None, flops=flops,
                                      repeats=repeats, warmup=1, mem_mb=ref_mem)
                    rec = out[-1]
                    rec.update(ref="helios_unfused", ref_ms=unfused["ms"], ref_gflops=unfused["gflops"],
                               ratio=unfused["ms"] / rec["ms"], ref_mem_mb=ref_mem)
        return out
    finally:
        selection.force("attention", None)


def run(args) -> list[dict]:
    return records(QUICK if args.quick else FULL, np.random.default_rng(0), args.repeats,
                   getattr(args, "variant", None), with_helios_unfused=not args.no_helios_unfused)
