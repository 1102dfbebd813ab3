"""Bundle the source of real modules into one text that imports only torch and the standard library.

An exported ``model.py`` is made of the blocks' own code, not of copies kept beside it: this module
reads the modules that define the classes an architecture uses (:func:`inspect.getsource`), keeps
the top-level definitions reachable from them (following ``from module import name`` into other
bundled modules, whose import lines are dropped, since the names now live in the one file) and
writes them in an order where every module comes after the modules it imports from. Imports of
:data:`ALLOWED_IMPORTS` are gathered into one header.

Rules for a bundled module (every block module follows them, and a user's registered block must
too): the definitions that are bundled use torch and the standard library modules of
:data:`ALLOWED_IMPORTS`, and names of other bundled modules imported as ``from module import name``
without ``as`` (an import nothing bundled uses is left out, whatever it is); its top level holds
only imports, functions, classes (decorators allowed), assignments to one name and docstrings; no
two bundled modules define one name. Anything else raises ``ValueError`` naming the module.

Docstrings are kept without their examples (:func:`strip_examples`): a block's doctest imports it
from rankitect, which the exported file must run without.

>>> from rankitect.blocks.common import FieldLinear
>>> text = bundle([FieldLinear])
>>> [line.split("(")[0] for line in text.splitlines() if line.startswith(("class", "def", "import", "from"))]
['from __future__ import annotations', 'import torch', 'import torch.nn.functional as F', 'from torch import nn', \
'def check_request', 'class MaskedLinear', 'class FieldLinear']
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field

# The only modules an exported model.py imports; everything else is bundled or refused.
ALLOWED_IMPORTS = ("__future__", "collections", "dataclasses", "functools", "inspect", "json", "math", "typing",
                   "torch")
FUTURE = "from __future__ import annotations"


@dataclass(frozen=True)
class Definition:
    """A top-level function, class or assignment of a bundled module, with the names it refers to."""

    module: str
    name: str
    line: int
    source: str
    uses: frozenset[str]


@dataclass
class ModuleSource:
    """A module read for bundling: its definitions, the names it imports from bundled modules, its
    allowed imports and its refused ones (bound name -> import statement; refused only if used)."""

    name: str
    definitions: dict[str, Definition] = field(default_factory=dict)
    imported: dict[str, tuple[str, str]] = field(default_factory=dict)
    external: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)


def _allowed(module: str) -> bool:
    return module.split(".")[0] in ALLOWED_IMPORTS


def _bundlable(module: str) -> bool:
    """Whether ``module`` may be bundled: neither the standard library nor a third-party package."""
    top = module.split(".")[0]
    if top in sys.stdlib_module_names:
        return False
    path = getattr(sys.modules.get(module) or importlib.import_module(module), "__file__", None) or ""
    return top == "rankitect" or not ("site-packages" in path or "dist-packages" in path)


def _read_import(info: ModuleSource, node: ast.Import | ast.ImportFrom, package: str | None) -> None:
    if isinstance(node, ast.Import):
        for alias in node.names:
            bound = alias.asname or alias.name.split(".")[0]
            target = info.external if _allowed(alias.name) else info.refused
            target[bound] = ast.unparse(ast.Import(names=[alias]))
        return
    module = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level else node.module
    if module == "__future__":
        return
    for alias in node.names:
        statement = f"from {module} import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
        if _allowed(module):
            info.external[alias.asname or alias.name] = statement
        elif alias.asname not in (None, alias.name) or alias.name == "*" or not _bundlable(module):
            info.refused[alias.asname or alias.name] = statement
        else:
            info.imported[alias.name] = (module, alias.name)


@functools.cache
def read_module(name: str) -> ModuleSource:
    """The top-level definitions and imports of module ``name`` (see the module docstring's rules)."""
    module = importlib.import_module(name)
    try:
        text = inspect.getsource(module)
    except (OSError, TypeError) as err:
        raise ValueError(f"bundle: cannot read the source of module {name!r}: {err}") from None
    lines = text.splitlines()
    info = ModuleSource(name)
    package = module.__package__
    for node in ast.parse(text).body:
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
        kept = strip_examples(node, lines)[start - 1 : node.end_lineno]
        source = "\n".join(line for line in kept if line is not None)  # whole lines: trailing comments stay
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            _read_import(info, node, package)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            info.definitions[node.name] = Definition(name, node.name, start, source, _names(node))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and _target(node) is not None:
            if _target(node) != "__all__":
                info.definitions[_target(node)] = Definition(name, _target(node), start, source, _names(node))
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):  # docstrings pass
            raise ValueError(f"bundle: {name}: unsupported top-level statement {ast.unparse(node)[:60]!r}")
    return info


def strip_examples(node: ast.AST, lines: list[str]) -> list[str | None]:
    """``lines`` (a module's source, one string a line) with the lines of the doctest examples in
    the docstrings of ``node`` and below replaced by ``None``: each ``>>>`` line, its ``...`` lines
    and its expected output, up to a blank line, the next ``>>>`` or the end of the docstring (whose
    closing quotes stay), and the blank line before examples that ended the docstring. ``None``, not
    removed, so that ``node``'s line numbers still index the result.

    >>> src = ["def f():", "    '''Two.", "", "    >>> f()", "    2", "    '''", "    return 2"]
    >>> strip_examples(ast.parse("\\n".join(src)).body[0], src)
    ['def f():', "    '''Two.", None, None, None, "    '''", '    return 2']
    """
    out: list[str | None] = list(lines)
    for owner in ast.walk(node):
        body = getattr(owner, "body", None)
        if not (isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            continue
        first, last = body[0].lineno - 1, body[0].end_lineno - 1  # 0-based, inclusive; the opening line stays
        in_example = False
        for i in range(first + 1, last + 1):
            text = lines[i].strip()
            in_example = bool(text) and (in_example or text.startswith(">>>"))
            if not in_example:
                continue
            quote = text[-3:] if i == last and text[-3:] in ('"""', "'''") else ""
            out[i] = lines[i][: len(lines[i]) - len(lines[i].lstrip())] + quote if quote else None
        before = max((i for i in range(first + 1, last) if out[i] is not None), default=None)
        if before is not None and before < last - 1 and not lines[before].strip():
            out[before] = None  # the blank line that led into examples now ending the docstring
    return out


def _target(node: ast.Assign | ast.AnnAssign) -> str | None:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return targets[0].id if len(targets) == 1 and isinstance(targets[0], ast.Name) else None


def _names(node: ast.AST) -> frozenset[str]:
    return frozenset(n.id for n in ast.walk(node) if isinstance(n, ast.Name))


def _root(obj: object) -> tuple[str, str]:
    module, name = getattr(obj, "__module__", None), getattr(obj, "__name__", None)
    if module is None or name is None or getattr(sys.modules.get(module), name, None) is not obj:
        raise ValueError(f"bundle: {obj!r} is not a top-level function or class of its module")
    return module, name


def _resolve(module: str, name: str) -> Definition:
    """The definition that ``name`` of ``module`` is, following re-exports between bundled modules."""
    seen = set()
    while (module, name) not in seen:
        seen.add((module, name))
        info = read_module(module)
        if name in info.definitions:
            return info.definitions[name]
        if name not in info.imported:
            raise ValueError(f"bundle: module {module!r} defines no top-level {name!r}")
        module, name = info.imported[name]
    raise ValueError(f"bundle: {name!r} is imported in a cycle ({module})")


def collect(roots: Iterable[object]) -> tuple[list[Definition], dict[str, str]]:
    """The definitions reachable from ``roots`` and the allowed imports they need (bound name -> statement)."""
    needed: dict[str, Definition] = {}
    external: dict[str, str] = {}
    todo = [_resolve(*_root(obj)) for obj in roots]
    while todo:
        d = todo.pop()
        if d.name in needed:
            if needed[d.name] is not d:
                raise ValueError(f"bundle: {d.name!r} is defined in both {needed[d.name].module} and {d.module}")
            continue
        needed[d.name] = d
        info = read_module(d.module)
        for used in sorted(d.uses - {d.name}):
            if used in info.definitions or used in info.imported:
                todo.append(_resolve(d.module, used))
            elif used in info.refused:
                raise ValueError(f"bundle: {d.module}.{d.name} uses {info.refused[used]!r}; an exported model.py "
                                 f"imports only {list(ALLOWED_IMPORTS)}, and other bundled modules as "
                                 "'from module import name' (no 'as')")
            elif used in info.external:
                statement = info.external[used]
                if external.setdefault(used, statement) != statement and not _same_binding(used, statement,
                                                                                            external[used]):
                    raise ValueError(f"bundle: {used!r} is imported as {statement!r} and {external[used]!r}")
    return list(needed.values()), external


def _same_binding(name: str, first: str, second: str) -> bool:
    """Whether two import statements bind ``name`` to one object, or to two of one name
    (``typing.Callable`` and ``collections.abc.Callable`` annotate alike: annotations are never evaluated)."""
    values = [_bound(statement) for statement in (first, second)]
    return values[0] is values[1] or all(getattr(v, "__name__", None) == name for v in values)


def _bound(statement: str) -> object:
    """The object an allowed import statement binds (``import a.b as c``, ``from a import b as c``)."""
    node = ast.parse(statement).body[0]
    alias = node.names[0]
    if isinstance(node, ast.ImportFrom):
        return getattr(importlib.import_module(node.module), alias.name)
    return importlib.import_module(alias.name if alias.asname else alias.name.split(".")[0])


def _module_order(definitions: list[Definition]) -> list[str]:
    """Bundled modules, each after the bundled modules it imports from (depth-first)."""
    modules = sorted({d.module for d in definitions}, key=lambda m: min(d.line for d in definitions if d.module == m))
    order: list[str] = []

    def visit(module: str, path: tuple[str, ...]) -> None:
        if module in order or module in path:
            return
        for source, _ in read_module(module).imported.values():
            if source in modules:
                visit(source, (*path, module))
        order.append(module)

    for module in modules:
        visit(module, ())
    return order


def bundle(roots: Iterable[object], header: Iterable[str] = ()) -> str:
    """One source text: ``from __future__ import annotations``, the allowed imports (with the
    statements of ``header``), then ``roots`` and every definition they use, module by module in
    dependency order and in source order within a module."""
    definitions, external = collect(roots)
    statements = sorted({*header, *external.values()}, key=_import_key)
    order = _module_order(definitions)
    ranked = sorted(definitions, key=lambda d: (order.index(d.module), d.line))
    body = "\n\n\n".join(d.source for d in ranked)
    groups = ["\n".join(s for s in statements if _import_key(s)[0] == third) for third in (False, True)]
    return f"{FUTURE}\n\n" + "\n\n".join(g for g in groups if g) + f"\n\n\n{body}"


def _import_key(statement: str) -> tuple[int, str]:
    """``import x`` before ``from x import y``, then by module, as isort writes them."""
    module = statement.split()[1]
    return (module.split(".")[0] == "torch", statement.startswith("from"), module, statement)


__all__ = ["ALLOWED_IMPORTS", "Definition", "ModuleSource", "bundle", "collect", "read_module", "strip_examples"]
