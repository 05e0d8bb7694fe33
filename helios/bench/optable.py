"""docs/OPS.md's table of spec-declared ops, generated from the registry:
`python -m helios.bench.optable` rewrites it; tests/kernels/test_opspecs.py checks that it is current."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from helios.bench import catalogue
from helios.kernels.contract.spec import specs

BENCH = catalogue.declare(__name__, why="it writes docs/OPS.md's op table (no benchmark)")

BEGIN, END = "<!-- optable:begin (python -m helios.bench.optable) -->", "<!-- optable:end -->"
DOC = Path(__file__).resolve().parents[2] / "docs" / "OPS.md"


def _source(module: str) -> str:
    """The file that declares `module`, relative to the repository (a package's is its __init__.py)."""
    return Path(sys.modules[module].__file__).resolve().relative_to(DOC.parents[1]).as_posix()


def table() -> str:
    """The markdown table: op, forward (tensor then scalar arguments), backward, FLOPs and bytes per element, variant
    family, tested dtypes, declaring file."""
    rows = ["| op | forward | backward | FLOPs/elem | bytes/elem | variants | dtypes | declared in |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in specs():
        first = next(s.sample_inputs("f32", None, np.random.default_rng(0)))
        sized = {k: v for k, v in first.scalars.items() if k not in s.scalars}  # sizes a shape fixes (attention's B, T)
        scalars = "".join(f", {k}" for k in (*sized, *s.scalars))
        args = f"[{', '.join(s.args)}]" if s.packed else ", ".join(s.args)  # a packed op takes one list
        results = ", ".join(f"{o} (written into {s.inplace[o]})" if o in s.inplace else o for o in s.outputs)
        forward = f"{args}{scalars} → {results}"
        grad_scalars = "".join(f", {k}" for k in s.grad_kwargs({**sized, **s.scalars}))
        notes = [f"+= into sinks: {', '.join(s.sinks)}"] * bool(s.sinks) + \
            [f"d{a} + {kw} in one pass" for a, kw in s.folds.items()]
        sunk = f" ({'; '.join(notes)})" if notes else ""
        back = f"`{s.name}_backward({', '.join((*s.saves, 'dy'))}{grad_scalars})` → {', '.join(s.grads)}{sunk}" \
            if s.backward else "-"
        rows.append(f"| `{s.name}` — {s.doc} | {forward} | {back} | {s.flops((1,))} | {s.bytes((1,))} | {s.family} | "
                    f"{', '.join(s.dtypes)} | `{_source(s.module)}` |")
    return "\n".join(rows)


def render(text: str) -> str:
    """`text` with the block between the markers replaced by the current table."""
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


if __name__ == "__main__":
    DOC.write_text(render(DOC.read_text()))
    sys.exit(0)
