"""`python -m helios.bench [NAME ...] [--quick] [--json] [options]`: run benchmark modules, print records.

With no NAME the kernel benchmarks run, in the order their modules declare (helios.bench.catalogue): not
`tune` (it writes tuning results), `bf16` (dtype pairs of kernels the others time) or `replay` (training steps,
not kernels), each of which says so in its declaration. Options after the names go to each module; an option
one module does not know is ignored by it.

A benchmark module declares itself (`BENCH = catalogue.declare(__name__, families=..., order=...)`), has
`run(args) -> iterable of records` (dicts with "event": "bench"), and may have `add_arguments(parser)` for its
own options and `format_records(records) -> str` for the text output (default: `harness.format_table`). Adding
a benchmark is one module in helios/bench/ (BENCHMARKS finds it). Named benchmarks import only their own
modules, so one broken module does not break the others; the default run and `--help` read every declaration.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

# harness first (catalogue loads no numpy): it sets BLAS thread policies before numpy loads BLAS
from helios.bench import catalogue, harness

# Every benchmark module of helios.bench, by its name; found without importing them.
BENCHMARKS: dict[str, str] = {name: f"helios.bench.{name}" for name in catalogue.benchmark_names()}


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m helios.bench", description="helios benchmarks; `NAME --help` shows a benchmark's options",
        epilog="benchmarks: " + ", ".join(sorted(BENCHMARKS)))
    parser.add_argument("names", metavar="NAME", nargs="*", help="benchmarks to run (default: all but "
                        + ", ".join(sorted(set(BENCHMARKS) - set(catalogue.default_order()))) + ")")
    return parser


def _module_parser(name: str, module) -> argparse.ArgumentParser:
    doc = (module.__doc__ or "").strip()
    parser = argparse.ArgumentParser(prog=f"python -m helios.bench {name}", description=doc or None,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object per line")
    add = getattr(module, "add_arguments", None)
    if add is not None:
        add(parser)
    if "--quick" not in parser._option_string_actions:
        parser.add_argument("--quick", action="store_true", help="small shapes only")
    return parser


def _takes_positionals(name: str) -> bool:
    """Whether a benchmark's own parser takes positional arguments (then it runs alone, e.g. `tune matmul`)."""
    module = importlib.import_module(BENCHMARKS[name])
    return any(not action.option_strings for action in _module_parser(name, module)._actions)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    split = next((i for i, a in enumerate(argv) if a.startswith("-")), len(argv))
    names, options = argv[:split], argv[split:]
    if names and names[0] in BENCHMARKS and _takes_positionals(names[0]):  # `tune matmul`: arguments, not names
        names, options = names[:1], argv[1:]
    unknown = [n for n in names if n not in BENCHMARKS]
    if not unknown and not names and options in (["-h"], ["--help"]):  # asked for: stdout, success
        _top_parser().print_help()
        return 0
    if unknown:
        _top_parser().print_help(sys.stderr)
        print(f"\nunknown benchmark(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    many = len(names) != 1
    from helios.env import cache_warning

    if cache_warning():  # the limits, tuning winners and pipelines are then kept for this process only
        print(f"warning: {cache_warning()}", file=sys.stderr)
    for name in names or catalogue.default_order():
        module = importlib.import_module(BENCHMARKS[name])
        parser = _module_parser(name, module)
        args, _ = parser.parse_known_args(options) if many else (parser.parse_args(options), [])
        args.name = name
        records = []
        for rec in module.run(args):
            records.append(rec)
            if args.json:
                print(json.dumps(rec), flush=True)
        if not args.json:
            fmt = getattr(module, "format_records", None) or harness.format_table
            print(f"== {name} ==" if many else "", fmt(records), sep="\n" if many else "")
    return 0


if __name__ == "__main__":
    from helios.errors import HeliosError

    try:
        sys.exit(main())
    except HeliosError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
