"""No import cycle among rankitect's modules: read from the ast of every module, nothing imported.

An edge ``a -> b`` is any ``import rankitect.b`` / ``from rankitect.b import x`` / relative import in
module ``a``, at module level or inside a function or class (a deferred import still ties the two
modules together). ``from rankitect.pkg import sub`` where ``sub`` is a submodule of ``pkg`` is an
edge to that submodule; ``from rankitect.pkg import name`` of anything else is an edge to ``pkg``.
Imports under ``if TYPE_CHECKING:`` do not count: they are never executed and exist only for
annotations.

A package's ``__init__`` is its own node (``rankitect.search``), so re-exports in an ``__init__``
count like any other import; the implicit import of a parent package that Python runs before any
of its submodules is not an edge (else every package with re-exports would be a cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

import rankitect

ROOT = Path(rankitect.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except those under ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def edges(name: str, path: Path, known: set[str]) -> set[str]:
    """The rankitect modules that module ``name`` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import sub`` ties to the submodule ``sub``; ``from pkg import name`` to ``pkg``
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            while target and target not in known:  # "rankitect.a.b.attr" -> "rankitect.a.b"
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: edges(name, path, known) for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            strong(v)
    return found


def test_the_graph_sees_imports_at_every_depth_but_not_type_checking_ones() -> None:
    g = graph()
    # module level, and deferred inside a function (runner opens the data in __init__)
    assert "rankitect.search.base" in g["rankitect.search.random_search"]
    assert "rankitect.data" in g["rankitect.search.runner"]
    # base imports Architecture only for annotations
    assert "rankitect.space" not in g["rankitect.search.base"]


def test_cycles_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_search_has_no_import_cycle() -> None:
    g = graph()
    search = {m: {t for t in ts if t.startswith("rankitect.search")} for m, ts in g.items()
              if m.startswith("rankitect.search")}
    assert cycles(search) == []


def test_the_package_has_no_import_cycle() -> None:
    assert cycles(graph()) == []
