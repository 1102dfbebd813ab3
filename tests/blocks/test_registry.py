"""The registry and the one construction path: duplicates, unknown and missing params, validation."""

from __future__ import annotations

import pytest

from rankitect.blocks import BLOCKS, Block, block_params, build_block, register_block


def test_every_block_is_registered() -> None:
    expected = {"mlp", "efc", "dot", "fm", "dcn", "attention", "wukong", "dhen", "gating", "sum"}
    assert expected <= set(BLOCKS)


def test_a_new_block_file_registers_itself_on_import(tmp_path) -> None:
    """Adding an op is one file in the package: no list in ``__init__`` to extend."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import rankitect

    shutil.copytree(Path(rankitect.__file__).parent, tmp_path / "rankitect",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "rankitect" / "blocks" / "toy_scale.py").write_text(
        "import torch\n"
        "from rankitect.blocks.base import FLAT, Block, register_block\n\n\n"
        "@register_block('toy_scale')\n"
        "class ToyScale(Block):\n"
        "    in_kind = FLAT\n"
        "    out_kind = FLAT\n\n"
        "    def __init__(self, in_features: int) -> None:\n"
        "        super().__init__()\n"
        "        self.out_features = in_features\n\n"
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        "        return 2 * x  # (B, D)\n"
    )
    probe = "import rankitect.blocks as b; print(b.BLOCKS['toy_scale'].__module__)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "rankitect.blocks.toy_scale"
    assert "toy_scale" not in BLOCKS  # the copy's registry, not this one


def test_duplicate_name_raises() -> None:
    class Another(Block):
        pass

    with pytest.raises(ValueError, match="'mlp' is already registered"):
        register_block("mlp")(Another)
    assert BLOCKS["mlp"] is not Another


def test_unknown_op_is_named() -> None:
    with pytest.raises(ValueError, match="'nope'"):
        build_block("nope", (4,), {})


def test_unknown_param_is_named() -> None:
    with pytest.raises(ValueError, match="'widht'"):
        build_block("mlp", (4,), {"widht": 3})


def test_missing_param_is_named() -> None:
    with pytest.raises(ValueError, match="'out_fields'"):
        build_block("efc", (4, 2), {})


def test_block_params_exclude_request_in() -> None:
    assert set(block_params("mlp")) == {"width", "num_layers", "activation", "norm", "dropout"}
    assert set(block_params("dhen")) == {"modules", "out_fields", "combine"}


@pytest.mark.parametrize(
    ("op", "in_shape", "params", "request_in", "bad"),
    [
        ("mlp", (4,), {"width": 0}, None, "width"),
        ("mlp", (4,), {"width": 3, "num_layers": 0}, None, "num_layers"),
        ("mlp", (4,), {"width": 3, "activation": "tanhh"}, None, "tanhh"),
        ("mlp", (4,), {"width": 3, "norm": "groupnorm"}, None, "groupnorm"),
        ("mlp", (4,), {"width": 3, "dropout": 1.0}, None, "dropout"),
        ("attention", (3, 6), {"dropout": -0.1}, None, "dropout"),
        ("mlp", (4,), {"width": 3}, 5, "request_in"),
        ("efc", (4, 2), {"out_fields": 0}, None, "out_fields"),
        ("dot", (1, 2), {}, None, "in_fields"),
        ("dcn", (4,), {"low_rank": 5}, None, "low_rank"),
        ("dcn", (4,), {"low_rank": -1}, None, "low_rank"),
        ("attention", (3, 6), {"num_heads": 4}, None, "num_heads"),
        ("wukong", (3, 4), {"mlp_layers": -1}, None, "mlp_layers"),
        ("wukong", (3, 4), {"low_rank": 0}, None, "low_rank"),
        ("dhen", (3, 4), {"modules": ["dot", "conv", "fm"]}, None, "conv"),
        ("dhen", (3, 4), {"modules": "dot"}, None, "modules"),
        ("dhen", (3, 4), {"modules": ["dot", "dot"]}, None, "distinct"),
        ("dhen", (3, 4), {"combine": "mean"}, None, "mean"),
        ("gating", (3, 4), {"width": 2}, 1, "pair"),
        ("sum", (3, 4), {"width": 2}, (1, 5), "request_in"),
    ],
)
def test_bad_values_are_named(op: str, in_shape: tuple, params: dict, request_in, bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        build_block(op, in_shape, params, request_in=request_in)


def test_dhen_accepts_any_sequence_of_names() -> None:
    from_list = build_block("dhen", (3, 4), {"modules": ["fm", "dcn", "linear"], "out_fields": 2})
    from_tuple = build_block("dhen", (3, 4), {"modules": ("fm", "dcn", "linear"), "out_fields": 2})
    assert from_list.module_names == from_tuple.module_names == ("fm", "dcn", "linear")
