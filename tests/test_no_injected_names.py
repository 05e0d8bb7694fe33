"""Every name is defined where grep finds it (CONVENTIONS rule 16): no module of helios/, autograd/ or trainer/
writes into its globals (`globals()[name] = ...`, `globals().update(...)`, the same through a bare `vars()`), and
no call passes a `namespace=` for a helper to fill. Read statically (ast), with a negative control; and
autograd.functional gives each op spec one public name (`layer_norm`, not also `layernorm`)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("helios", "autograd", "trainer")
WRITERS = {"update", "setdefault", "__setitem__", "__delitem__", "pop", "popitem", "clear"}


def _is_namespace_call(node: ast.AST) -> bool:
    """`globals()`, or `vars()` with no argument (the caller's namespace, at module level its globals)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and
            (node.func.id == "globals" or (node.func.id == "vars" and not node.args)))


def injections(source: str, filename: str = "<snippet>") -> list[str]:
    """`file:line: what` for each write into globals() or namespace= keyword in `source`, in line order."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename)):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for t in targets:
            if isinstance(t, ast.Subscript) and _is_namespace_call(t.value):
                found.append((node.lineno, "item write into globals()"))
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in WRITERS and _is_namespace_call(f.value):
                found.append((node.lineno, f"globals().{f.attr}(...)"))
            found += [(node.lineno, "namespace= keyword") for k in node.keywords if k.arg == "namespace"]
    return [f"{filename}:{line}: {what}" for line, what in sorted(found)]


def test_no_module_injects_names():
    offenders = []
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            offenders += injections(path.read_text(), str(path.relative_to(REPO)))
    assert not offenders, "define these names where grep finds them:\n" + "\n".join(offenders)


def test_the_walk_finds_each_form_of_injection():
    """Negative control: each form is found, on its own line; reading the namespace is not a write."""
    snippet = ("globals()['a'] = 1\n"
               "globals().update(b=2)\n"
               "vars()['c'] = 3\n"
               "globals()['d'] += 1\n"
               "globals().setdefault('e', 5)\n"
               "declare('f', namespace=globals())\n"
               "del globals()['a']\n"
               "names = sorted(globals())\n"               # reads: allowed
               "g = globals().get('g')\n"
               "h = vars(obj)\n"
               "obj.__dict__.update(x=1)\n")             # an object's attributes, not a module's globals
    lines = [int(found.split(":")[1]) for found in injections(snippet)]
    assert lines == [1, 2, 3, 4, 5, 6, 7], injections(snippet)


def test_functional_gives_each_op_spec_one_public_name():
    """autograd.functional.OF_SPEC names the one function of each spec with a derived Function; where the spec's
    name differs from that function's (layernorm -> layer_norm), the spec's name is no second public name."""
    import autograd.functional as F
    from autograd.ops import specs as S

    assert set(F.OF_SPEC) == set(S.FUNCTIONS), set(F.OF_SPEC) ^ set(S.FUNCTIONS)
    for spec_name, fn in F.OF_SPEC.items():
        assert getattr(F, fn.__name__) is fn, (spec_name, fn)  # a module-level def, found by its own name
        if fn.__name__ != spec_name:
            assert not hasattr(F, spec_name), f"autograd.functional has both {spec_name} and {fn.__name__}"
    assert len({fn.__name__ for fn in F.OF_SPEC.values()}) == len(F.OF_SPEC)
