"""Half-precision matmul on the matrix units (cooperative matrix, fp16 in, fp32 accumulate) vs torch.matmul in
fp16 on CUDA (cuBLAS on tensor cores). On a device without fp16 cooperative matrices (lavapipe, older GPUs)
it reports that and times nothing.

Shapes are MxNxK; `--layouts` adds the transposed forms training uses (nt: x @ W^T, tn: dY^T @ X).
"""

from __future__ import annotations

import argparse

import numpy as np

from helios.bench.harness import device_name, record, time_pair, torch_reference
from helios.bench.matmul import parse_shapes

SQUARES = [(n, n, n) for n in (1024, 2048, 4096, 8192)]
GPT = [(10240, 1152, 384), (10240, 1536, 384), (10240, 384, 1536)]  # alpha-8l: B*T = 20*512, qkv/mlp up/down
QUICK = [(1024, 1024, 1024), (4096, 4096, 4096), (10240, 1152, 384)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="three shapes")
    parser.add_argument("--shapes", type=parse_shapes, help="MxNxK,... instead of the default shapes")
    parser.add_argument("--layouts", default="nn,nt,tn", help="comma-separated of nn, nt, tn, tt (default nn,nt,tn)")
    parser.add_argument("--variant", help="a tiling (cm64, cm128) or 'all'; default: the op's choice")
    parser.add_argument("--repeats", type=int, default=None, help="timed samples per figure (median)")


def run(args) -> list[dict]:
    import helios.runtime as rt
    from helios.device import get_device
    from helios.kernels import matmul_coopmat as mc
    from helios.kernels import selection

    info = get_device().info
    if not mc.supported(info):
        print(f"matmul_half: '{info.name}' has no fp16 cooperative matrices (VK_KHR_cooperative_matrix); "
              "nothing to time")
        return []
    torch, cuda = torch_reference()
    shapes = args.shapes or (QUICK if args.quick else SQUARES + GPT)
    repeats = args.repeats or 10
    tilings = list(mc.TILINGS) if args.variant == "all" else [args.variant]
    records, dev = [], device_name()
    for layout in [x.strip() for x in args.layouts.split(",") if x.strip()]:
        for M, N, K in shapes:
            rng = np.random.default_rng(0)
            a = rng.standard_normal((K, M) if layout[0] == "t" else (M, K)).astype(np.float16)
            b = rng.standard_normal((N, K) if layout[1] == "t" else (K, N)).astype(np.float16)
            ta, tb, c = rt.from_numpy(a), rt.from_numpy(b), rt.empty((M, N))
            trans = {"trans_a": layout[0] == "t", "trans_b": layout[1] == "t"}
            ref_fn = None
            if torch is not None and cuda:
                xa, xb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
                xa, xb = (xa.T if trans["trans_a"] else xa), (xb.T if trans["trans_b"] else xb)
                out = torch.empty((M, N), dtype=torch.float16, device="cuda")

                def ref_fn(xa=xa, xb=xb, out=out):
                    torch.matmul(xa, xb, out=out)
            for tiling in tilings:
                name = tiling or selection.choose("matmul_coopmat", (M, N, K, 1), "fp16", info)

                def device_fn(name=name, ta=ta, tb=tb, c=c, trans=trans):
                    mc.matmul_half(ta, tb, out=c, tiling=name, **trans)

                ms, ref_ms = time_pair(device_fn, ref_fn, repeats=repeats, warmup=2, cuda_ref=cuda)
                records.append(record(f"matmul_half_{layout}", name, f"{M}x{N}x{K}", ms, mc.flops(M, N, K),
                                      mc.nbytes(M, N, K), "torch-cuda-fp16" if ref_fn else None, ref_ms, device=dev))
    return records
