"""The SPIR-V words of every registered kernel variant, hashed: one line `kernel variant sha256` per module, sorted.

    python tools/spirv_hashes.py [OUT.txt]

A refactoring that must not change what the GPU runs (a move of kernel files, a rename of a helper) records the
table before and compares it after: `diff before.txt after.txt` is empty when every module is word-for-word the
same. Kernels are those helios.kernels.discover(), the DSL's examples and the bench's device-limit kernels
register (helios.spirv.registry); a variant whose module does not build is listed with `BUILD-FAILED` and the error's
type instead of a hash.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helios.errors import HeliosError  # noqa: E402
from helios.kernels import discover  # noqa: E402
from helios.spirv import registry  # noqa: E402

MODULES = ("helios.spirv.examples", "helios.ceilings.kernels")  # kernels outside helios.kernels


def table() -> list[str]:
    """`kernel variant sha256` for every registered kernel variant, sorted."""
    discover()
    lines = []
    for kernel in registry.load_all(modules=MODULES):
        for variant in kernel.variants:
            try:
                digest = hashlib.sha256(kernel.module(variant).words).hexdigest()
            except HeliosError as exc:
                digest = f"BUILD-FAILED {type(exc).__name__}"
            lines.append(f"{kernel.name} {variant} {digest}")
    return sorted(lines)


def main(argv: list[str]) -> int:
    text = "\n".join(table()) + "\n"
    if argv:
        Path(argv[0]).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
