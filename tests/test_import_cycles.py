"""No import cycle among rankitect's modules: read from the ast of every module, nothing imported.

An edge ``a -> b`` is any ``import rankitect.b`` / ``from rankitect.b import x`` / relative import in
module ``a``, at module level, inside a function or class, or under ``if TYPE_CHECKING:`` (a
deferred import still ties the two modules together, and an annotation-only one says that ``a``
needs ``b``'s types: a cycle of them is two modules that cannot be read, moved or tested apart).

A package's ``__init__`` is its own node (``rankitect.search``), its face: re-exports in an
``__init__`` count like any other import. ``from rankitect.pkg import name`` runs ``pkg``'s face and
reads ``name`` from it, so it is an edge to ``pkg``, and also to ``pkg.name`` when that is a
submodule; ``import rankitect.pkg.sub`` and ``from rankitect.pkg.sub import x`` are edges to ``sub``
alone. The implicit import of a parent package that Python runs before any of its submodules is not
an edge (else every package with re-exports would be a cycle).
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


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth (``if TYPE_CHECKING:`` blocks included)."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


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
            # ``from pkg import sub`` ties to ``pkg`` (its face runs first) and to the submodule ``sub``
            targets = [base, *(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known)]
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


def test_the_graph_sees_imports_at_every_depth_and_package_faces() -> None:
    g = graph()
    # module level, and deferred inside a function (runner opens the data in __init__)
    assert "rankitect.search.base" in g["rankitect.search.strategies.random"]
    assert "rankitect.data" in g["rankitect.search.running.runner"]
    # base imports Architecture only for annotations: an edge all the same
    assert "rankitect.space" in g["rankitect.search.base"]
    # ``from rankitect.space import engineer, nasrec`` in space's own face: its submodules, no self-edge
    assert {"rankitect.space.engineer", "rankitect.space.nasrec"} <= g["rankitect.space"]
    assert "rankitect.space" not in g["rankitect.space"]


def test_a_face_imported_from_inside_its_package_is_an_edge(tmp_path: Path) -> None:
    """The shape of ``export/__init__ -> exporter -> codegen -> export``: ``from pkg import sub`` in a
    module of ``pkg`` whose face imports that module back is a cycle; ``from pkg.sub import x`` is not."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pkg.a import f\n")
    (pkg / "b.py").write_text("X = 1\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n")
    known = {"pkg", "pkg.a", "pkg.b"}
    paths = {"pkg": pkg / "__init__.py", "pkg.a": pkg / "a.py", "pkg.b": pkg / "b.py"}
    g = {name: edges(name, path, known) for name, path in paths.items()}
    assert g["pkg.a"] == {"pkg", "pkg.b"}
    assert cycles(g) == [["pkg", "pkg.a"]]
    (pkg / "a.py").write_text("from pkg.b import X\n")
    g["pkg.a"] = edges("pkg.a", paths["pkg.a"], known)
    assert g["pkg.a"] == {"pkg.b"} and cycles(g) == []


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
