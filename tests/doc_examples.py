"""The shell command examples of README.md, docs/*.md and every CLI's `--help`, extracted one per logical line.

A Markdown example is a line of a shell (or untyped) fenced block, or an inline code span, whose first word after
any `VAR=value` assignments is a command (python, python3, make, mpiexec, source, tools/...; `.venv/bin/` or not):
continuation lines are joined and a trailing `# comment` is dropped. A `for ... done` block is one example.
An inline span is an example only with an argument (`python -m helios info` is; `tools/mesa22.sh` is a file name).

The help texts come from one child process (`python -m tests.doc_examples helps`) that runs each entry point's
`--help` the way `python -m MODULE --help` does (runpy), finds its subcommands from the argparse subparsers it
built (and helios.bench's from its BENCHMARKS table), and runs `SUB --help` for each. Entry points: every
`__main__.py` of a package in the repo and every tools/*.py that uses argparse. A help example is an indented
line or a backtick span that starts with a command word, outside the usage block.

`python -m tests.doc_examples parse ARGV...` runs a Python command as far as its argparse parse and exits 0 there
(2, with argparse's message, where the arguments are refused): the check of an example that cannot run here.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import re
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_FENCES = {"", "sh", "bash", "console", "shell"}
_ASSIGN = r"(?:[A-Z_][A-Z0-9_]*=\S+\s+)*"
COMMAND = re.compile(rf"^{_ASSIGN}(?:\.venv/bin/)?(?:python3?|make|mpiexec|source|tools/[\w.-]+)(?=\s|$)")
# a synopsis, not a command: [optional] parts, a|b choices, ..., or an upper-case placeholder (CONFIG, DIR, FILE.json)
PLACEHOLDER = re.compile(r"[\[\]|{}<>]|\.\.\.|^(?:[A-Z][A-Z_]*)(?:\.[a-z]+)?$|=[A-Z][A-Z_]*$")


@dataclass(frozen=True)
class Example:
    """One command as printed (whitespace normalised), where it is printed, and the line there (0: a help text)."""

    text: str
    source: str
    line: int = 0

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.text}" if self.line else f"{self.source}: {self.text}"


def strip_comment(line: str) -> str:
    """The line without a trailing shell comment (a `#` after whitespace, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def is_command(text: str, inline: bool = False) -> bool:
    """Whether a line or span is a command; an inline span needs an argument after its program (or module)."""
    if not COMMAND.match(text):
        return False
    if not inline:
        return True
    words = re.sub(rf"^{_ASSIGN}", "", text).split()
    program = 3 if words[:2] in (["python", "-m"], ["python3", "-m"], [".venv/bin/python", "-m"]) else 1
    return len(words) > program


def is_synopsis(text: str) -> bool:
    """A command pattern with placeholders (`--split val|train|both`, `CONFIG.toml`, `[--json]`), not a command."""
    words = text.split()
    return any(PLACEHOLDER.search(w) for w in words[1:] if not w.startswith("$"))


def _fenced_examples(lines: list[str], first: int, source: str) -> list[Example]:
    found: list[Example] = []
    i = 0
    while i < len(lines):
        start = i
        text = strip_comment(lines[i])
        while text.endswith("\\") and i + 1 < len(lines):  # a continued line
            i += 1
            text = text[:-1].rstrip() + " " + strip_comment(lines[i]).strip()
        if text.lstrip().startswith("for "):  # a loop: one example, up to its `done`
            body = [text.strip()]
            while not body[-1].startswith("done") and i + 1 < len(lines):
                i += 1
                line = strip_comment(lines[i])
                while line.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line[:-1].rstrip() + " " + strip_comment(lines[i]).strip()
                body.append(line.strip())
            found.append(Example("\n".join(body), source, first + start))
        elif is_command(text.strip()):
            found.append(Example(" ".join(text.split()), source, first + start))
        i += 1
    return found


def markdown_examples(path: Path) -> list[Example]:
    """The commands of one Markdown file: shell/untyped fenced blocks line by line, then inline code spans."""
    source = str(path.relative_to(REPO))
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Example] = []
    prose: list[str] = []  # the text outside fences, fenced lines blanked (line numbers kept)
    fence: str | None = None
    block: list[str] = []
    block_start = 0
    for n, line in enumerate(lines, 1):
        marker = re.match(r"^\s*```(\S*)", line)
        if marker and fence is None:
            fence, block, block_start = marker.group(1), [], n + 1
            prose.append("")
            continue
        if marker and fence is not None:
            if fence in SHELL_FENCES:
                found += _fenced_examples(block, block_start, source)
            fence = None
            prose.append("")
            continue
        if fence is not None:
            block.append(line)
            prose.append("")
        else:
            prose.append(line)
    text = "\n".join(prose)
    for span in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
        command = " ".join(span.group(1).split())
        if is_command(command, inline=True):
            found.append(Example(command, source, text.count("\n", 0, span.start()) + 1))
    return found


def help_examples(source: str, text: str) -> list[Example]:
    """The commands a help text shows: indented lines and backtick spans after its usage block."""
    body = text.split("\n\n", 1)[1] if text.startswith("usage:") and "\n\n" in text else text
    found = [Example(" ".join(line.split()), source) for line in body.splitlines()
             if line[:1].isspace() and is_command(line.strip())]
    for span in re.findall(r"`([^`]+)`", body):
        command = " ".join(span.split())
        if is_command(command, inline=True):
            found.append(Example(command, source))
    return found


def all_examples(helps: dict[str, str]) -> list[Example]:
    """Every example of the docs and of the help texts (`helps`: source -> text, from `collect_helps`)."""
    found = [e for doc in DOCS for e in markdown_examples(doc)]
    return found + [e for source, text in helps.items() for e in help_examples(source, text)]


# --- the child process: help texts and parse-only runs ----------------------------------------------------------


def entry_points() -> list[list[str]]:
    """The argv prefix of every CLI: `-m PACKAGE` for each package __main__.py, the path of each argparse tool."""
    skip = {".venv", "tests", ".git"}
    mains = [p for p in [*REPO.glob("*/__main__.py"), *REPO.glob("*/*/__main__.py")]
             if p.relative_to(REPO).parts[0] not in skip]
    modules = sorted(".".join(p.relative_to(REPO).parts[:-1]) for p in mains)
    tools = sorted(p for p in (REPO / "tools").glob("*.py") if "argparse" in p.read_text(encoding="utf-8"))
    return [["-m", m] for m in modules] + [[str(p.relative_to(REPO))] for p in tools]


class _Parsed(Exception):
    """Raised by the parse-only hook once the outermost argparse parse returns."""


_parsers: list[argparse.ArgumentParser] = []
_depth = 0
_parse_only = False
_original_parse = argparse.ArgumentParser.parse_known_args


def _parse_known_args(self, args=None, namespace=None):
    """Records each parser a program parses with; in parse-only mode, stops the program after the outer parse."""
    global _depth
    _parsers.append(self)
    _depth += 1
    try:
        result = _original_parse(self, args, namespace)
    finally:
        _depth -= 1
    if _parse_only and _depth == 0:
        raise _Parsed
    return result


def _run(prefix: list[str], args: list[str]) -> tuple[int, str]:
    """Run `python PREFIX ARGS` in this process (as `python -m` or `python FILE` would), returning (exit, stdout)."""
    target = prefix[-1]
    sys.argv = [target, *args]
    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out):
        try:
            if prefix[0] == "-m":
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                sys.path.insert(0, str(REPO / Path(target).parent))
                runpy.run_path(str(REPO / target), run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except _Parsed:
            code = 0
    return code, out.getvalue()


def _subcommands(prefix: list[str]) -> list[str]:
    """The subcommands of the parser the last run built: its subparsers, or a BENCHMARKS table of its __main__."""
    names: list[str] = []
    for parser in _parsers[:1]:
        for action in parser._actions:  # noqa: SLF001 (argparse keeps its subparsers only here)
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                names += list(action.choices)
    if not names and prefix[0] == "-m":
        module = importlib.import_module(f"{prefix[1]}.__main__")  # its main() runs only as __main__
        names = sorted(getattr(module, "BENCHMARKS", {}))
        del sys.modules[module.__name__]  # runpy runs it again as __main__, fresh
    return names


def collect_helps() -> dict[str, str]:
    """`python ... --help` of every entry point and subcommand: {"python -m trainer run --help": text}."""
    helps: dict[str, str] = {}
    for prefix in entry_points():
        shown = " ".join(["python", *prefix])
        _parsers.clear()
        code, text = _run(prefix, ["--help"])
        helps[f"{shown} --help"] = text if code == 0 else f"EXIT {code}\n{text}"
        for name in _subcommands(prefix):
            _parsers.clear()
            code, text = _run(prefix, [name, "--help"])
            helps[f"{shown} {name} --help"] = text if code == 0 else f"EXIT {code}\n{text}"
    return helps


def main(argv: list[str]) -> int:
    global _parse_only
    os.environ["COLUMNS"] = "200"  # argparse wraps at COLUMNS: long lines keep each example on one line
    argparse.ArgumentParser.parse_known_args = _parse_known_args
    if argv[:1] == ["helps"]:
        print(json.dumps(collect_helps()))
        return 0
    if argv[:1] == ["parse"]:
        _parse_only = True
        rest = argv[1:]
        prefix, args = (rest[:2], rest[2:]) if rest[0] == "-m" else (rest[:1], rest[1:])
        code, out = _run(prefix, args)
        print(out, end="")
        return code
    print("usage: python -m tests.doc_examples {helps | parse -m MODULE ARGS... | parse FILE ARGS...}",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
