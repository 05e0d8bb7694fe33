"""Every environment read goes through an env module: no module of helios/, autograd/ or trainer/ other than
helios/env.py and trainer/env.py touches os.environ or os.getenv/putenv/unsetenv (read statically, with ast).

The one use allowed elsewhere is building a child process's environment from this one's: `dict(os.environ, ...)`
or `{**os.environ, ...}`, which copies the environment for a subprocess and reads no variable."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("helios", "autograd", "trainer")
ENV_MODULES = {"helios/env.py", "trainer/env.py"}
ENV_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def env_touches(source: str) -> list[int]:
    """The lines where `source` touches the process environment, child-environment copies excepted."""
    tree = ast.parse(source)
    copies: set[int] = set()  # ids of os.environ nodes that only seed a child's environment
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and node.args:
            copies.add(id(node.args[0]))
        elif isinstance(node, ast.Dict):
            copies.update(id(v) for k, v in zip(node.keys, node.values, strict=True) if k is None)  # {**os.environ}
    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr in ENV_NAMES and isinstance(node.value, ast.Name)
                and node.value.id == "os" and id(node) not in copies):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and \
                any(alias.name in ENV_NAMES for alias in node.names):
            lines.append(node.lineno)
    return sorted(lines)


def test_only_the_env_modules_read_the_environment():
    found = []
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel not in ENV_MODULES:
                found += [f"{rel}:{line}" for line in env_touches(path.read_text())]
    assert not found, "read the environment through helios/env.py or trainer/env.py: " + ", ".join(found)


def test_the_checker_finds_reads_and_writes_and_allows_child_environments():
    """Negative control: each way of touching the environment is found; the two child-environment copies are not."""
    touching = ['import os\nos.environ.get("X")', 'import os\nos.environ["X"] = "1"', 'import os\nos.getenv("X")',
                'import os\nos.environ.setdefault("X", "1")', 'from os import environ', 'from os import getenv',
                'import os\nenv = os.environ', 'import os\nos.putenv("X", "1")', 'import os\nf(**os.environ)']
    for source in touching:
        assert env_touches(source), source
    assert env_touches(Path(REPO / "helios/env.py").read_text())  # the env module itself would be caught
    for source in ['import os\nsubprocess.run(c, env=dict(os.environ, A="1"))',
                   'import os\nsubprocess.run(c, env={**os.environ, "A": "1"})', 'import os\nos.cpu_count()']:
        assert not env_touches(source), source
