"""Token + position embedding, forward and backward, derived from its op spec (helios.kernels.indexing.embedding):
the spec's input generator, forward, backward (with the sorted plan sorted_segments builds, as the trainer does once
per batch) and numpy reference, at a GPT's batch shapes. The generator draws V = N // 3 + 1 table rows, so ids
repeat about three times (the scatter's duplicate case). The backward variant is what the "embedding_backward" rule
picks.
Counted: forward reads N ids and N rows of the table and of pos_table and writes N rows (N * D adds); backward
reads dy twice (by id, by position), writes every row of both f32 gradients (zeroed or summed) and reads the plan
(2 N * D adds).
"""

from __future__ import annotations

import argparse

import numpy as np

from helios.bench import catalogue

BENCH = catalogue.declare(__name__, families=("embedding_backward",), order=60)

FULL = [(8, 1024, 768), (16, 256, 512)]  # (B, T, D): GPT-2 small's batch, a smaller model's
QUICK = [(2, 65, 33), (4, 128, 128)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="two small shapes only")
    parser.add_argument("--repeats", type=int, default=10, help="timed samples per figure (median reported)")


def _counts(ids: np.ndarray, table: np.ndarray, pos_table: np.ndarray) -> dict:
    """(flops, bytes) of the forward and the backward in f32."""
    n, d = ids.size, table.shape[1]
    rows = 4 * n * d
    return {"forward": (n * d, 4 * n + 3 * rows),
            "backward": (2 * n * d, 2 * rows + 4 * d * (table.shape[0] + pos_table.shape[0]) + 3 * 4 * n)}


def records(shapes, rng: np.random.Generator, repeats: int) -> list[dict]:
    """One record for the forward and one for the backward per (B, T, D), each against the spec's reference."""
    import helios.runtime as rt
    from helios.bench.harness import compare
    from helios.kernels.contract import selection
    from helios.kernels.contract.spec import spec_of
    from helios.kernels.indexing.embedding import forward_variant, sorted_segments

    spec = spec_of("embedding")
    out = []
    for B, T, D in shapes:
        host = spec.inputs(rng, (B, T, D))
        ids, table, pos_table = host
        args = [rt.from_numpy(x) for x in host]
        y = spec.apply(spec.forward, args)
        dy = rng.standard_normal(y.shape, dtype=np.float32)
        tdy = rt.from_numpy(dy)
        saved = spec.saved(args, y)
        plan = {"plan": sorted_segments(ids, table.shape[0])}
        counts = _counts(ids, table, pos_table)
        shape = f"{B}x{T}x{D} V={table.shape[0]}"
        fwd = compare("embedding", forward_variant(D, with_pos=True), shape,
                      lambda args=args: spec.apply(spec.forward, args),
                      lambda host=host: spec.apply(spec.reference, host), ref="numpy",
                      flops=counts["forward"][0], nbytes=counts["forward"][1], repeats=repeats)
        scatter = selection.choose("embedding_backward", (ids.size, table.shape[0], D, True))
        bwd = compare("embedding_backward", scatter, shape,
                      lambda saved=saved, tdy=tdy, plan=plan: spec.backward(*saved, tdy, **plan),
                      lambda host=host, dy=dy: spec.reference_backward(*host, dy), ref="numpy",
                      flops=counts["backward"][0], nbytes=counts["backward"][1], repeats=repeats)
        out += [fwd, bwd]
        del args, saved, tdy, y
    return out


def run(args: argparse.Namespace) -> list[dict]:
    return records(QUICK if args.quick else FULL, np.random.default_rng(0), args.repeats)
