"""The commands and files README.md and docs/*.md name exist: every `python -m MODULE` resolves
(importlib.util.find_spec), and every path under the repo's top-level folders (`tools/...`, `configs/...`,
`docs/...`, `helios/...`, ...) is there, including the bare file names of a `| \\`dir/\\` | ... |` table row."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ROOTS = ("tools", "scripts", "configs", "docs", "helios", "autograd", "trainer", "telemetry", "tests")

MODULE = re.compile(r"\bpython3? -m ([A-Za-z_][\w.]*)")
# a path starts at a root folder not preceded by part of another path (so `trainer/configs/x` is not `configs/x`);
# the second group catches a glob or placeholder (`attention_*.py`, `<name>.toml`), which names no one file
PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(ROOTS)})/[\w.-]*(?:/[\w.-]+)*)([*<{{]?)")
TABLE_ROW = re.compile(r"^\|\s*`([\w.-]+(?:/[\w.-]+)*/)`\s*\|(.*)\|\s*$", re.MULTILINE)
BARE_FILE = re.compile(r"`([\w-]+(?:\.[\w-]+)*\.(?:py|sh|md|toml|json|png))`")


def named_modules(text: str) -> set[str]:
    """The modules of the `python -m MODULE` commands in a Markdown text."""
    return set(MODULE.findall(text))


def named_paths(text: str) -> set[str]:
    """Repo-relative paths a Markdown text names: root-folder paths anywhere, and the bare file names listed in
    a table row whose first cell is a folder (`| \\`tools/\\` | \\`mesa22.sh\\` ... |` names tools/mesa22.sh)."""
    paths = {path.rstrip(".") for path, pattern in PATH.findall(text) if not pattern}
    for folder, rest in TABLE_ROW.findall(text):
        paths.update(folder + name for name in BARE_FILE.findall(rest))
    return paths


def missing(text: str) -> list[str]:
    """What the text names that is not in the repo: modules find_spec cannot resolve, paths that do not exist."""
    gone = [f"python -m {m}" for m in sorted(named_modules(text)) if not _resolves(m)]
    return gone + [p for p in sorted(named_paths(text)) if not _exists(p)]


def _exists(path: str) -> bool:
    """The path is there, or it names an object in a Python file (`trainer/backends/torch_model.GPT`)."""
    stem, _, attr = path.rpartition(".")
    return (REPO / path).exists() or (attr.isidentifier() and (REPO / f"{stem}.py").is_file())


def _resolves(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package that is not there
        return False


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_named_commands_and_files_exist(doc):
    text = doc.read_text()
    assert named_modules(text) or named_paths(text), f"{doc.name} names nothing: is the pattern still right?"
    assert missing(text) == [], f"{doc.relative_to(REPO)} names what is not in the repo"


def test_the_check_finds_a_stale_name():
    stale = ("| `tools/` | `gpu_env.sh` (set-up), `bench_train_gpu.py`, `step_memory.py` |\n"
             "Run `.venv/bin/python -m trainer run configs/shakespeare.toml` or `python -m helios.benchh`;\n"
             "see docs/TRAINER.md, docs/NOPE.md, tools/loss_parity.py, trainer/loop.Trainer and tools/*.py.\n")
    assert named_paths(stale) == {"tools/", "tools/gpu_env.sh", "tools/bench_train_gpu.py", "tools/step_memory.py",
                                  "configs/shakespeare.toml", "docs/TRAINER.md", "docs/NOPE.md",
                                  "tools/loss_parity.py", "trainer/loop.Trainer"}
    assert named_modules(stale) == {"trainer", "helios.benchh"}
    assert missing(stale) == ["python -m helios.benchh", "docs/NOPE.md", "tools/bench_train_gpu.py"]
