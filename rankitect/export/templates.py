"""Copy the standalone twins an export needs, and what they use, into one source text.

The twins live in real, importable modules (:mod:`rankitect.export.standalone`) rather than in
strings, so they are read, tested and type-checked like any other code. This module reads their
top-level definitions with :mod:`ast` and returns the ones reachable from the classes an
architecture uses, in definition order. The twins may import only :data:`HEADER`'s modules and
each other; anything else is an error here, so the bundle always runs with PyTorch alone.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType

from rankitect.export.standalone import ensemble, field_blocks, flat_blocks, layers, serving

# Definition order: each module uses only itself and the modules before it.
TEMPLATE_MODULES: tuple[ModuleType, ...] = (layers, flat_blocks, field_blocks, ensemble, serving)
PACKAGE = "rankitect.export.standalone"
HEADER = "import json\nimport math\n\nimport torch\nimport torch.nn.functional as F\nfrom torch import nn\n"
# (module, alias) of every import the header provides; ``from torch import nn`` is ("torch.nn", "nn").
HEADER_IMPORTS = {("json", None), ("math", None), ("torch", None), ("torch.nn.functional", "F"), ("torch.nn", "nn")}


@dataclass(frozen=True)
class Definition:
    """A top-level function, class or constant of a twin module, with the names it refers to."""

    name: str
    source: str
    uses: frozenset[str]


def _names(node: ast.AST) -> frozenset[str]:
    return frozenset(n.id for n in ast.walk(node) if isinstance(n, ast.Name))


def _check_import(module: ModuleType, node: ast.Import | ast.ImportFrom) -> None:
    if isinstance(node, ast.ImportFrom):
        if node.level == 0 and node.module is not None and node.module.startswith(PACKAGE + "."):
            return  # a sibling twin: its definitions are bundled too
        pairs = {(f"{node.module}.{a.name}", a.asname or a.name) for a in node.names}
    else:
        pairs = {(a.name, a.asname) for a in node.names}
    extra = pairs - HEADER_IMPORTS
    if extra or (isinstance(node, ast.ImportFrom) and node.level):
        raise ValueError(f"{module.__name__}: import {ast.unparse(node)!r} is not provided by the export header")


def _module_definitions(module: ModuleType) -> list[Definition]:
    text = inspect.getsource(module)
    lines = text.splitlines()
    found: list[Definition] = []
    for node in ast.parse(text).body:
        # Whole lines, so that a trailing comment on the last line stays (top-level nodes start at column 0).
        source = "\n".join(lines[node.lineno - 1 : node.end_lineno])
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            _check_import(module, node)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.decorator_list:
            found.append(Definition(node.name, source, _names(node)))
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found.append(Definition(node.targets[0].id, source, _names(node.value)))
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):  # docstrings pass
            raise ValueError(f"{module.__name__}: unsupported top-level statement {ast.unparse(node)[:60]!r}")
    return found


def definitions() -> list[Definition]:
    """Every definition of the twin modules, in definition order; a name defined twice is an error."""
    found: list[Definition] = []
    for module in TEMPLATE_MODULES:
        found += _module_definitions(module)
    names = [d.name for d in found]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"standalone twins define {dupes} more than once")
    return found


def bundle(roots: Iterable[str]) -> str:
    """The source of ``roots`` and everything they use, in definition order, without imports.

    >>> text = bundle(["FieldLinear"])
    >>> [line for line in text.splitlines() if line.startswith(("class", "def"))]
    ['class MaskedLinear(nn.Linear):', 'class FieldLinear(MaskedLinear):']
    """
    defs = definitions()
    by_name = {d.name: d for d in defs}
    needed: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name not in by_name:
            raise ValueError(f"no standalone twin named {name!r}")
        if name in needed:
            continue
        needed.add(name)
        todo += [n for n in by_name[name].uses if n in by_name and n not in needed]
    return "\n\n\n".join(d.source for d in defs if d.name in needed)


__all__ = ["HEADER", "TEMPLATE_MODULES", "Definition", "bundle", "definitions"]
