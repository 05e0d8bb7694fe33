"""`python -m helios.bench NAME [--json] [options]`: run one benchmark module and print its records.

A benchmark module has `run(args) -> iterable of records` (dicts with "event": "bench"), and may have
`add_arguments(parser)` for its own options and `format_records(records) -> str` for the text output
(default: `harness.format_table`). Adding a benchmark is one line in BENCHMARKS. Only the module asked
for is imported, so one broken module does not break the others.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from helios.bench import harness  # first: it sets BLAS thread policies before numpy loads BLAS

BENCHMARKS: dict[str, str] = {
    "dispatch": "helios.bench.dispatch",
    "elementwise": "helios.bench.elementwise",
    "adamw": "helios.bench.adamw",
    "cross_entropy": "helios.bench.cross_entropy",
    "matmul": "helios.bench.matmul", "limits": "helios.bench.limits", "tune": "helios.bench.tune",
    "softmax": "helios.bench.softmax", "layernorm": "helios.bench.layernorm", "attention": "helios.bench.attention",
}


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m helios.bench", description="helios benchmarks; `NAME --help` shows a benchmark's options",
        epilog="benchmarks: " + ", ".join(sorted(BENCHMARKS)))
    parser.add_argument("name", metavar="NAME", choices=sorted(BENCHMARKS), help="the benchmark to run")
    return parser


def _module_parser(name: str, module) -> argparse.ArgumentParser:
    doc = (module.__doc__ or "").strip()
    parser = argparse.ArgumentParser(prog=f"python -m helios.bench {name}", description=doc or None,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object per line")
    add = getattr(module, "add_arguments", None)
    if add is not None:
        add(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0].startswith("-") or argv[0] not in BENCHMARKS:
        _top_parser().parse_args(argv[:1])  # prints help or a "choose from" error and exits
        return 2
    name = argv[0]
    module = importlib.import_module(BENCHMARKS[name])
    args = _module_parser(name, module).parse_args(argv[1:])
    args.name = name
    records = []
    for rec in module.run(args):
        records.append(rec)
        if args.json:
            print(json.dumps(rec), flush=True)
    if not args.json:
        fmt = getattr(module, "format_records", None) or harness.format_table
        print(fmt(records))
    return 0


if __name__ == "__main__":
    from helios.errors import HeliosError

    try:
        sys.exit(main())
    except HeliosError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
