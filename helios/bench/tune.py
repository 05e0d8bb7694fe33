"""Auto-tuner: `python -m helios.bench tune matmul [--shapes MxNxK,...] [--layouts nn,nt,tn]`.

Times every candidate tiling (the device family's: register-blocked on CPU devices, shared-memory tiled on
GPUs; `--all-tilings` for both) for each shape and layout, and stores the fastest in
`helios.env.cache_dir()/tuning-<device key>.json`, which the matmul op then uses for exactly those shapes.
Prints one record per candidate (`winner` marks the stored one).
"""

from __future__ import annotations

import argparse

from helios.bench import catalogue
from helios.bench.harness import device_name, record, time_device
from helios.bench.matmul import GPT, parse_shapes

BENCH = catalogue.declare(__name__, families=("matmul",), why="it writes tuning results")



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("family", choices=BENCH.families, help="what to tune")
    parser.add_argument("--shapes", type=parse_shapes, help="MxNxK,... (default: the GPT-small shapes)")
    parser.add_argument("--layouts", default="nn,nt,tn", help="comma-separated of nn, nt, tn, tt")
    parser.add_argument("--all-tilings", action="store_true", help="also try the other device family's tilings")
    parser.add_argument("--repeats", type=int, default=3, help="timed samples per candidate (median)")
    parser.add_argument("--quick", action="store_true", help="one timed sample per candidate")
    parser.add_argument("--dry-run", action="store_true", help="time and print, but store nothing")


def candidates(info, all_tilings: bool) -> list[str]:
    from helios.kernels.matmul import select as sel

    if all_tilings:  # the tuner times f32 matmuls: the half-only cooperative-matrix tilings are not candidates
        return [t for t in sel.BLOCKS if t not in sel.COOPMAT]
    return list(sel.device_tilings(info))


def tune_shape(layout: str, M: int, N: int, K: int, names: list[str], repeats: int, dev: str) -> list[dict]:
    """One record per candidate tiling for one shape; the fastest has winner=True."""
    import helios.runtime as rt
    from helios.bench.matmul import _host
    from helios.kernels import matmul as mm
    from helios.kernels.contract import selection

    a, b = _host(layout, M, N, K)
    ta, tb, c = rt.from_numpy(a), rt.from_numpy(b), rt.empty((M, N))
    trans = {"trans_a": layout[0] == "t", "trans_b": layout[1] == "t"}
    records = []
    for name in names:
        selection.force("matmul", name)
        try:
            ms = time_device(lambda: mm.matmul(ta, tb, out=c, **trans), repeats=repeats, warmup=1)
        finally:
            selection.force("matmul", None)
        records.append(record(f"matmul_{layout}", mm.variant_name(layout, M, N, K, 1, name), f"{M}x{N}x{K}", ms,
                              mm.flops(M, N, K), mm.nbytes(M, N, K), device=dev, tiling=name, winner=False))
    best = min(records, key=lambda r: r["ms"])
    best["winner"] = True
    return records


def run(args) -> list[dict]:
    from helios.device import get_device
    from helios.kernels.matmul import select as sel

    info = get_device().info
    dev = device_name()
    names = candidates(info, args.all_tilings)
    shapes = args.shapes or GPT
    repeats = 1 if args.quick else args.repeats
    records, winners = [], {}
    for layout in (x.strip() for x in args.layouts.split(",") if x.strip()):
        for M, N, K in shapes:
            recs = tune_shape(layout, M, N, K, names, repeats, dev)
            records.extend(recs)
            winners[sel.shape_key(layout, M, N, K)] = next(r["tiling"] for r in recs if r["winner"])
    if not args.dry_run:
        path = sel.save_tuning(info, winners)
        for r in records:
            r["stored_in"] = str(path) if path else "nowhere: the cache directory is not writable"
    return records


def format_records(records: list[dict]) -> str:
    from helios.bench.harness import format_table

    lines = [format_table(records), "winners:"]
    lines += [f"  {r['kernel'][7:]}:{r['shape']} -> {r['tiling']} ({r['gflops']:.1f} GFLOPS)"
              for r in records if r["winner"]]
    if records and "stored_in" in records[0]:
        lines.append(f"stored in {records[0]['stored_in']}")
    return "\n".join(lines)
