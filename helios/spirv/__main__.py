"""python -m helios.spirv {list | dis NAME[:VARIANT] | validate}: inspect the registered kernels."""

from __future__ import annotations

import argparse
import sys

from helios.errors import HeliosError
from helios.spirv import registry
from helios.spirv.tools import disassemble, verdicts


def _load() -> tuple[list, int]:
    """All kernels, and the number of kernel modules that failed to import (reported on stderr)."""
    from helios.kernels import discover  # the kernel package finds its own modules; the DSL does not know it

    errors: list = []
    discover(errors)
    # the DSL's examples, and the bench's device-limit kernels (helios.ceilings.kernels), which no family owns
    kernels = registry.load_all(errors, modules=("helios.spirv.examples", "helios.ceilings.kernels"))
    for name, exc in errors:
        print(f"IMPORT FAILED {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return kernels, len(errors)


def _list() -> int:
    kernels, failed = _load()
    for kernel in kernels:
        extra = f"  (requires {', '.join(kernel.requires)})" if kernel.requires else ""
        print(f"{kernel.name}: {', '.join(kernel.variants)}{extra}")
    return 1 if failed else 0


def _dis(target: str) -> int:
    _load()
    name, _, variant = target.partition(":")
    kernel = registry.get(name)
    if not variant and len(kernel.variants) > 1:  # which one the device would run depends on it: ask for a name
        names = list(kernel.variants)
        print(f"error: kernel '{name}' has {len(names)} variants: name one as {name}:VARIANT, e.g. "
              + ", ".join(f"{name}:{v}" for v in names[::max(1, len(names) // 3)][:3])
              + (f" ({len(names) - 3} more: python -m helios.spirv list)" if len(names) > 3 else ""), file=sys.stderr)
        return 2
    print(disassemble(kernel.module(variant or None)), end="")
    return 0


def _validate() -> int:
    kernels, invalid = _load()
    valid = 0
    modules = []
    for kernel in kernels:
        for vname in kernel.variants:
            try:
                modules.append(kernel.module(vname))
            except HeliosError as exc:
                invalid += 1
                print(f"FAILED {kernel.name}:{vname}: {exc}\n", file=sys.stderr)
    for mod, error in zip(modules, verdicts(modules), strict=True):  # batched spirv-val runs
        if error is None:
            valid += 1
        else:
            invalid += 1
            print(f"INVALID {mod.name}:{mod.variant}\n{error}\n", file=sys.stderr)
    print(f"{valid} kernel variants valid, {invalid} invalid")
    return 1 if invalid else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helios.spirv", description="Inspect the registered kernels.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("list", help="list registered kernels and their variants")
    dis = sub.add_parser("dis", help="print the disassembly of a kernel variant (spirv-dis): NAME:VARIANT, or "
                         "NAME alone for a kernel with one variant")
    dis.add_argument("target", metavar="NAME[:VARIANT]", help="e.g. softmax:sg_vec4 (`list` names them)")
    sub.add_parser("validate", help="run spirv-val on every registered kernel variant")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            return _list()
        if args.command == "dis":
            return _dis(args.target)
        return _validate()
    except HeliosError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
