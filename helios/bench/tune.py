"""Auto-tuner: `python -m helios.bench tune CONFIG.toml [--budget-s 120] [--families a,b]` tunes every family with
choices at exactly the shapes that trainer config trains (helios.bench.tuner: one training step's launches, each
candidate timed in a whole replayed step), with a progress bar and a time budget, stores the winners and prints,
per family and shape, the table's choice, the winner and the speed-up.

`python -m helios.bench tune matmul [--shapes MxNxK,...] [--layouts nn,nt,tn]` times every candidate tiling (the
device family's: register-blocked on CPU devices, shared-memory tiled on GPUs; `--all-tilings` for both) for each
shape and layout, and stores the fastest in `helios.env.cache_dir()/tuning-<device key>.json`, which the matmul op
then uses for exactly those shapes. Prints one record per candidate (`winner` marks the stored one).
"""

from __future__ import annotations

import argparse

from helios.bench import catalogue
from helios.bench.harness import device_name, record, time_device
from helios.bench.matmul import GPT, parse_shapes

BENCH = catalogue.declare(__name__, families=("matmul",), why="it writes tuning results")



def _families_epilog() -> str:
    """Every family with choices and its candidates, from the selection contract."""
    from helios.bench.tuner import tunable_families
    from helios.kernels.contract import selection

    lines = ["families with choices (a config's tune times those its training step launches, at its shapes;",
             "--families picks some; decode and decode_kernels are sampling's, which a training step never runs):"]
    lines += [f"  {f.name}: {', '.join(selection.label(c) for c in f.candidates)}" for f in tunable_families()]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="CONFIG.toml|matmul",
                        help="a trainer config (tune every family at its shapes) or matmul (the GPT shapes)")
    parser.add_argument("--budget-s", type=float, default=120.0, help="CONFIG: seconds to spend at most (120)")
    parser.add_argument("--families", help="CONFIG: comma-separated families to tune (default: all with choices)")
    parser.add_argument("--margin", type=float, default=0.02,
                        help="CONFIG: how much faster than the table a winner must be, in each of three "
                             "sittings (0.02)")
    parser.epilog = _families_epilog()
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
    if args.target.endswith(".toml"):
        return run_config(args)
    if args.target not in BENCH.families:
        raise SystemExit(f"tune: {args.target!r} is neither a CONFIG.toml nor matmul; another family is tuned at a "
                         f"config's shapes: tune CONFIG.toml --families {args.target}")
    return run_matmul(args)


def _progress():
    """(update(done, total, what), close()) on stderr: a tqdm bar where tqdm is installed, else a plain line."""
    import sys

    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    state = {}

    def update(done: int, total: int, what: str) -> None:
        if tqdm is not None:
            bar = state.get("bar") or state.setdefault("bar", tqdm(total=total, unit="timing", file=sys.stderr))
            bar.set_postfix_str(what)
            bar.update(done - bar.n)
        else:
            print(f"\rtuning {done}/{total} {what:<60}", end="", file=sys.stderr, flush=True)

    def close() -> None:
        if "bar" in state:
            state["bar"].close()
        elif tqdm is None:
            print(file=sys.stderr)

    return update, close


def run_config(args) -> list[dict]:
    """Tune the config's shapes: one record per tuned (family, shape, dtype), then a summary record."""
    from helios.bench.tuner import tune_config
    from helios.kernels.contract import selection
    from trainer.config import load_config

    cfg = load_config(args.target)
    families = [f.strip() for f in args.families.split(",")] if args.families else None
    known = {f.name for f in selection.families()}
    if families and (unknown := [f for f in families if f not in known]):
        raise SystemExit(f"tune: unknown families {unknown} (known: {', '.join(sorted(known))})")
    update, close = _progress()
    try:
        report = tune_config(cfg, families=families, budget_s=args.budget_s, margin=args.margin,
                             repeats=1 if args.quick else 3, save=not args.dry_run, progress=update)
    finally:
        close()
    if families and set(report.absent) >= set(families):
        sampling = " (decode and decode_kernels serve `trainer sample`, not training)" * bool(
            {"decode", "decode_kernels"} & set(report.absent))
        raise SystemExit(f"tune: {args.target}'s training step never launches {', '.join(report.absent)}, so there "
                         f"is nothing of theirs to time in it{sampling}; pick families the step runs (`--help` "
                         "lists them)")
    records = [{"event": "tune", "family": t.family, "shape": selection.shape_key(t.shape), "dtype": t.dtype,
                "table": t.table, "winner": t.winner, "table_ms": t.table_ms, "winner_ms": t.winner_ms,
                "speedup": t.speedup, "timed": t.timed} for t in report.trials]
    records.append({"event": "tune_summary", "config": args.target, "seconds": report.seconds,
                    "tuned": len(report.trials), "skipped": [f"{f} {selection.shape_key(s)} {d}"
                                                             for f, s, d in report.skipped],
                    "absent": report.absent, "stored_in": report.stored_in, "device": device_name()})
    return records


def run_matmul(args) -> list[dict]:
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


def format_config(records: list[dict]) -> str:
    """Per family and shape: the table's choice, the winner and the step's speed-up; then what was left."""
    rows = [r for r in records if r["event"] == "tune"]
    summary = next(r for r in records if r["event"] == "tune_summary")
    head = (f"{'family':<19}{'shape':<24}{'dtype':<6}{'table':<22}{'winner':<22}"
            f"{'table ms':>9}{'tuned ms':>9}{'speed-up':>9}")
    lines = [head]
    for r in sorted(rows, key=lambda r: r["family"]):
        lines.append(f"{r['family']:<19}{r['shape']:<24}{r['dtype']:<6}{r['table']:<22}{r['winner']:<22}"
                     f"{r['table_ms']:>9.2f}{r['winner_ms']:>9.2f}{r['speedup']:>8.3f}x")
    lines.append("(ms: the device ms of the launches that choice changes, from timestamps (else one whole replayed "
                 "training step); speed-up: table / winner)")
    lines.append(f"{summary['tuned']} tuned in {summary['seconds']:.0f} s on {summary['device']}")
    if summary["skipped"]:
        lines.append(f"left by the budget ({len(summary['skipped'])}): " + "; ".join(summary["skipped"]))
    if summary["absent"]:
        lines.append("not in this config's training step (their table stays): " + ", ".join(summary["absent"]))
    if summary["stored_in"]:
        lines.append(f"stored in {summary['stored_in']}")
    return "\n".join(lines)


def format_records(records: list[dict]) -> str:
    from helios.bench.harness import format_table

    if records and records[-1].get("event") == "tune_summary":
        return format_config(records)

    lines = [format_table(records), "winners:"]
    lines += [f"  {r['kernel'][7:]}:{r['shape']} -> {r['tiling']} ({r['gflops']:.1f} GFLOPS)"
              for r in records if r["winner"]]
    if records and "stored_in" in records[0]:
        lines.append(f"stored in {records[0]['stored_in']}")
    return "\n".join(lines)
