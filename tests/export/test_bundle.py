"""The bundler: real modules' definitions, reachable from the roots, in an order that runs; bad imports refused."""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
import textwrap
import typing
from pathlib import Path
from types import ModuleType

import pytest

from rankitect.blocks import BLOCKS
from rankitect.export.bundle import bundle, read_module
from rankitect.export.plan import check_param
from tests.export.conftest import import_source


def write_modules(root: Path, monkeypatch: pytest.MonkeyPatch, **modules: str) -> dict[str, ModuleType]:
    """Write ``name=source`` modules into a fresh package under ``root`` and import them."""
    package = f"bundle_case_{root.name}"
    (root / package).mkdir()
    (root / package / "__init__.py").write_text("")
    for name, source in modules.items():
        (root / package / f"{name}.py").write_text(textwrap.dedent(source).strip() + "\n")
    monkeypatch.syspath_prepend(str(root))
    return {name: importlib.import_module(f"{package}.{name}") for name in modules}


def test_every_block_bundles_into_a_module_that_builds_it(tmp_path: Path) -> None:
    text = bundle(BLOCKS.values())
    imports = {n.module if isinstance(n, ast.ImportFrom) else a.name for n in ast.parse(text).body
               if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert not any(m.startswith("rankitect") for m in imports)
    module = import_source(text, tmp_path)
    for op, cls in BLOCKS.items():
        assert getattr(module, cls.__name__).op_name == op and module.BLOCKS[op] is getattr(module, cls.__name__)


def test_only_what_the_roots_use_and_imports_follow_the_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mods = write_modules(
        tmp_path, monkeypatch,
        low="""
            import math

            import numpy as np

            SCALE = 2.0


            def unused() -> object:
                return np.zeros(1)


            def double(x: float) -> float:
                return SCALE * math.floor(x)
            """,
        high="""
            from bundle_case_{name}.low import double


            class Twice:
                def __call__(self, x: float) -> float:
                    return double(x)
            """.replace("{name}", tmp_path.name),
    )
    text = bundle([mods["high"].Twice])
    tree = ast.parse(text)
    names = [n.name if hasattr(n, "name") else n.targets[0].id for n in tree.body
             if not isinstance(n, (ast.Import, ast.ImportFrom))]
    assert names == ["SCALE", "double", "Twice"]  # the module imported from comes first; `unused` and numpy stay out
    assert "numpy" not in text and "import math" in text
    assert import_source(text, tmp_path).Twice()(3.7) == 6.0


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("import os\n\ndef f() -> str:\n    return os.sep", "'import os'"),
        ("from subprocess import run\n\ndef f() -> object:\n    return run", "subprocess"),
        ("import numpy as np\n\ndef f() -> object:\n    return np", "numpy"),
        ("from bundle_case_{name}.other import g as h\n\ndef f() -> object:\n    return h", "'from bundle_case_"),
        ("try:\n    X = 1\nexcept ImportError:\n    X = 2\n\ndef f() -> int:\n    return X", "unsupported top-level"),
    ],
)
def test_refused_imports_and_statements_name_the_module(
    source: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mods = write_modules(tmp_path, monkeypatch, other="def g() -> int:\n    return 1",
                         mod=source.replace("{name}", tmp_path.name))
    with pytest.raises(ValueError, match=message) as err:
        bundle([mods["mod"].f])
    assert "mod" in str(err.value) and "\n" not in str(err.value)


def test_one_name_from_two_modules_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mods = write_modules(tmp_path, monkeypatch, a="def helper() -> int:\n    return 1",
                         b="def helper() -> int:\n    return 2\n\n\ndef g() -> int:\n    return helper()")
    with pytest.raises(ValueError, match="'helper' is defined in both"):
        bundle([mods["a"].helper, mods["b"].g])


def test_a_nested_class_is_not_a_root() -> None:
    class Local:
        pass

    with pytest.raises(ValueError, match="not a top-level"):
        bundle([Local])


def test_read_module_is_the_module_itself() -> None:
    info = read_module("rankitect.blocks.mlp")
    assert "MLP" in info.definitions and info.imported["Block"] == ("rankitect.blocks.base", "Block")
    assert sys.modules["rankitect.blocks.mlp"].MLP.__name__ == info.definitions["MLP"].name


@pytest.mark.parametrize("op", sorted(BLOCKS))
def test_every_param_schema_is_exportable_and_its_defaults_pass(op: str) -> None:
    """Every block's typed constructor gives the exporter types it can check; defaults pass the check."""
    cls = BLOCKS[op]
    params = inspect.signature(cls.__init__).parameters
    for name, hint in cls.param_schema().items():
        assert hint is not typing.Any, f"{op}.{name} has no annotation"
        default = params[name].default
        if default is not inspect.Parameter.empty:
            checked = check_param(name, list(default) if isinstance(default, tuple) else default, hint)
            assert checked == default or checked == tuple(default)


def test_check_param_is_exact_about_types() -> None:
    assert check_param("w", 3, int) == 3 and check_param("s", None, typing.Optional[float]) is None
    assert check_param("m", ["dot", "fm"], typing.Sequence[str]) == ("dot", "fm")
    assert check_param("a", "relu", typing.Literal["relu", "gelu"]) == "relu"
    for value, hint in [(True, int), (1, bool), (3.0, int), (float("nan"), float), ("x", typing.Literal["y"]),
                        ("dot", typing.Sequence[str]), ([1], typing.Sequence[str])]:
        with pytest.raises(ValueError):
            check_param("p", value, hint)
    with pytest.raises(ValueError, match="cannot be exported"):
        check_param("p", {}, dict)


def _text_lines(doc: str) -> list[str]:
    return [line.strip() for line in doc.splitlines() if line.strip()]


def test_bundled_docstrings_are_the_sources_without_their_examples(tmp_path: Path) -> None:
    """Reference: the standard library's doctest parser splits each original docstring into text
    and examples; the bundled docstring is that text, every line of it, and no example."""
    import doctest

    parser = doctest.DocTestParser()
    module = import_source(bundle(BLOCKS.values()), tmp_path)
    had_examples = 0
    for cls in BLOCKS.values():
        copy = getattr(module, cls.__name__)
        pairs = [(cls, copy)] + [(f, getattr(copy, name)) for name, f in vars(cls).items()
                                 if inspect.isfunction(f) and f.__doc__]
        for original, bundled in pairs:
            pieces = parser.parse(inspect.cleandoc(original.__doc__ or ""))
            had_examples += any(isinstance(p, doctest.Example) for p in pieces)
            text = "\n".join(p for p in pieces if isinstance(p, str))
            assert parser.get_examples(bundled.__doc__ or "") == [], f"{cls.__name__}: an example survived"
            assert _text_lines(bundled.__doc__ or "") == _text_lines(text), f"{original.__qualname__}"
    assert had_examples, "no block docstring has an example: nothing was tested"


# The exported file on its own: torch's directory added by hand to an isolated interpreter (-I -S),
# so rankitect cannot be imported; doctest collects nothing, and the module still loads and builds.
DOCTEST_SCRIPT = """
import doctest, importlib.util, sys
sys.path.append(sys.argv[1])
spec = importlib.util.spec_from_file_location("exported", sys.argv[2] + "/model.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
result = doctest.testmod(module)
assert result.attempted == 0, result
module.load(sys.argv[2])
print("ok")
"""


def test_an_exported_model_carries_no_doctest_and_loads_without_rankitect(tmp_path: Path) -> None:
    import subprocess

    import torch

    from rankitect.export import export_model
    from rankitect.space.testing import tiny_spec
    from tests.export.archs import ALL_OPS
    from tests.export.conftest import perturbed_model

    spec = tiny_spec()
    out = export_model(perturbed_model(ALL_OPS, spec), ALL_OPS, spec, tmp_path / "m")
    text = (out / "model.py").read_text()
    assert ">>>" not in text and "class DCN" in text
    (tmp_path / "check.py").write_text(DOCTEST_SCRIPT)
    torch_dir = str(Path(torch.__file__).resolve().parent.parent)
    run = subprocess.run([sys.executable, "-I", "-S", str(tmp_path / "check.py"), torch_dir, str(out)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]
