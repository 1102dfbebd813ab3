"""Blocks are the bottom layer: they import torch, the standard library, each other and the
registry type (``rankitect.registry``, which imports the standard library alone), nothing else.

That is what lets the exporter copy their source into a ``model.py`` that runs without rankitect.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import rankitect.blocks

BLOCKS_DIR = Path(rankitect.blocks.__file__).parent


def imported(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
    return found


@pytest.mark.parametrize("path", sorted(BLOCKS_DIR.glob("*.py")), ids=lambda p: p.name)
def test_a_block_module_imports_only_torch_the_standard_library_and_blocks(path: Path) -> None:
    for module in imported(path):
        top = module.split(".")[0]
        allowed = (top == "torch" or top in sys.stdlib_module_names or module.startswith("rankitect.blocks")
                   or module == "rankitect.registry")
        assert allowed, f"{path.name} imports {module}"


def test_the_registry_imports_only_the_standard_library() -> None:
    """Block modules import it, so the exporter copies it too."""
    path = BLOCKS_DIR.parent / "registry.py"
    assert {m for m in imported(path) if m.split(".")[0] not in sys.stdlib_module_names} == set()
