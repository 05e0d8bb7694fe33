"""No package-level import cycle in helios/, autograd/ or trainer/: the import graph is read statically (ast).

A node is a package (every module of `helios/kernels/rows/` is the node `helios.kernels.rows`, its __init__ too),
except the loose modules of a top-level package, which are nodes of their own (`helios.ops`, `helios.env`,
`trainer.loop`): each is a layer in itself. An edge is an import of one node by a module of another. Imports
between two loose modules of the same top-level package (autograd.engine and autograd.tensors) are module-level,
not package-level, and are left out: a cycle there stays inside one package.

Every import counts, function-level ("lazy") ones included: an import deferred into a function still makes its
package depend on the imported one at run time; deferring only hides a cycle from the interpreter, not from a
reader. Imports under `if TYPE_CHECKING:` never run and do not count. Strings given to importlib (discovery, the
trainer's backend registry) are not imports and do not count either.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("helios", "autograd", "trainer")

Graph = Mapping[str, Mapping[str, str]]  # node -> imported node -> where ("file:line") one such import is


def module_names(roots: Iterable[str] = ROOTS) -> dict[str, Path]:
    """Full module name -> file, for every .py under the roots (a package is named by its __init__.py)."""
    names = {}
    for root in roots:
        for path in sorted((REPO / root).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def node_of(module: str, packages: set[str]) -> str:
    """The package-level node of a module: its package, or itself when it is a package or a top-level module."""
    if module in packages or module.count(".") <= 1:
        return module
    return module.rsplit(".", 1)[0]


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(tree: ast.AST, module: str, is_package: bool, known: Iterable[str]) -> list[tuple[str, int]]:
    """(imported module, line) for every import in `tree` at any depth, outside `if TYPE_CHECKING:` blocks."""
    known = set(known)
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, one level up per extra dot
                package = module if is_package else module.rsplit(".", 1)[0]
                for _ in range(node.level - 1):
                    package = package.rsplit(".", 1)[0]
                base = f"{package}.{base}" if base else package
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub if sub in known else base, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def package_graph(roots: Iterable[str] = ROOTS) -> dict[str, dict[str, str]]:
    """The package-level import graph of the roots' modules (imports of anything outside them are left out)."""
    names = module_names(roots)
    packages = {name for name, path in names.items() if path.name == "__init__.py"}
    graph: dict[str, dict[str, str]] = {}
    for name, path in names.items():
        source = node_of(name, packages)
        tree = ast.parse(path.read_text(), str(path))
        for target, line in imports(tree, name, name in packages, names):
            while target and target not in names:  # `import helios.kernels.rows.softmax as x`: the module itself
                target = target.rpartition(".")[0]
            if not target:
                continue
            dest = node_of(target, packages)
            loose = source not in packages and dest not in packages and source.count(".") == dest.count(".") == 1
            if dest != source and not (loose and source.split(".")[0] == dest.split(".")[0]):
                graph.setdefault(source, {}).setdefault(dest, f"{path.relative_to(REPO)}:{line}")
    return graph


def find_cycle(graph: Graph) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None when it has none (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    for start in sorted(graph):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph.get(start, ())))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def describe(cycle: list[str], graph: Graph) -> str:
    """The cycle with one import that makes each of its edges."""
    return "; ".join(f"{a} -> {b} ({graph[a][b]})" for a, b in zip(cycle, cycle[1:]))


def test_no_package_level_import_cycle():
    graph = package_graph()
    assert "helios.kernels.rows" in graph and "helios.device" in graph, "the graph lost its nodes: is node_of right?"
    cycle = find_cycle(graph)
    assert cycle is None, f"package-level import cycle: {describe(cycle, graph)}"


def test_a_cycle_is_found_and_named():
    """Negative control: the search finds a cycle planted in a synthetic graph, and names each edge's import."""
    graph = {"a": {"b": "a.py:1"}, "b": {"c": "b.py:2", "d": "b.py:3"}, "c": {"a": "c.py:4"}, "d": {}}
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}
    assert "c -> a (c.py:4)" in describe(cycle, graph)
    assert find_cycle({"a": {"b": "x"}, "b": {"c": "y"}, "c": {}}) is None


def test_lazy_imports_count_and_type_checking_ones_do_not():
    """A function-level import is an edge; an import under `if TYPE_CHECKING:` is not; relative imports resolve."""
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import p.hidden\n"
                     "def f():\n    from p.q import r\n    from . import s\n")
    found = {name for name, _ in imports(tree, "p.m", False, {"p.q.r", "p.s"})}
    assert found == {"typing", "p.q.r", "p.s"}
