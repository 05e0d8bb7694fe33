"""Writing a generated, checked-in file (helios/ops.py, helios/spirv/grammar.py), or checking that it is current:
the one tail of tools/gen_ops.py and tools/gen_spirv_grammar.py."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(out: Path, text: str, check: bool, tool: str) -> int:
    """With `check`, exit code 1 (naming `tool` to run) when `out` differs from `text`, else 0; without, write it."""
    if check:
        current = out.read_text() if out.exists() else ""
        if current != text:
            print(f"{out} is out of date; run python {tool}", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    print(f"wrote {out} ({len(text.splitlines())} lines)")
    return 0
