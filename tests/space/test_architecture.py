"""The genotype: canonical params, JSON round trip, stable hash, immutability, validation messages."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import pytest

from rankitect.space.architecture import Architecture, BlockGene, HeadGene
from rankitect.space.params import Params


def make(**over: Any) -> Architecture:
    genes = (
        BlockGene("mlp", ("dense",), {"width": 8}),
        BlockGene("attention", ("sparse", 0), {"num_heads": 2}, tokens=2),
        BlockGene("dhen", (1,), {"modules": ["dot", "linear"], "out_fields": 3}),
    )
    kw: dict[str, Any] = {"blocks": genes, "head": HeadGene((2, 0), (16, 8)), "embedding_dim": 4}
    kw.update(over)
    return Architecture(**kw)


def test_json_round_trip_equal_and_same_hash() -> None:
    arch = make()
    back = Architecture.from_json(arch.to_json())
    assert back == arch and back.hash == arch.hash
    assert Architecture.from_dict(json.loads(arch.to_json(indent=2))) == arch


def test_hash_is_sha256_of_canonical_json() -> None:
    arch = make()
    canonical = json.dumps(arch.to_dict(), sort_keys=True, separators=(",", ":"))
    assert arch.hash == hashlib.sha256(canonical.encode()).hexdigest()[:16]
    assert make().hash == arch.hash
    other = make(head=HeadGene((2, 0), (16, 9)))
    assert other.hash != arch.hash and other != arch


def test_params_are_canonical_with_defaults_and_lists() -> None:
    explicit = BlockGene("mlp", ("dense",), {"width": 8, "num_layers": 1, "activation": "relu", "norm": "layernorm"})
    assert BlockGene("mlp", ("dense",), {"width": 8}) == explicit
    d = make().to_dict()["blocks"][2]["params"]
    assert d["modules"] == ["dot", "linear"] and list(d) == sorted(d)
    assert make().blocks[2].params["modules"] == ("dot", "linear")


def test_deep_immutable_and_hashable() -> None:
    arch = make()
    with pytest.raises(AttributeError):
        arch.embedding_dim = 8  # type: ignore[misc]
    with pytest.raises(TypeError):
        arch.blocks[0].params["width"] = 9  # type: ignore[index]
    assert isinstance(arch.blocks[2].params["modules"], tuple)
    assert len({arch, make()}) == 1
    assert hash(Params({"a": [1, 2]})) == hash(Params({"a": (1, 2)}))


def test_head_defaults_to_last_block() -> None:
    arch = Architecture((BlockGene("mlp", ("dense",), {"width": 8}),), embedding_dim=4)
    assert arch.head.inputs == (0,)


BAD_ARCHS = [
    ({"blocks": (BlockGene("mlp", ("dense",), {"width": 8}), BlockGene("dot", (1, "sparse")))}, "blocks[1].inputs[0]"),
    ({"blocks": (BlockGene("attention", ("sparse",), {"num_heads": 3}),)}, "blocks[0].params['num_heads']"),
    ({"blocks": (BlockGene("mlp", ("dense",), {"width": 8}), BlockGene("mlp", ("dense",), {"width": 8})),
      "head": HeadGene((1,))}, "blocks[0]"),
    ({"blocks": (BlockGene("mlp", ("dense",), {"width": 8}, tokens=2),)}, "blocks[0].tokens"),
    ({"blocks": (BlockGene("mlp", ("dense",), {"width": 8}),), "head": HeadGene((3,))}, "head.inputs[0]"),
    ({"embedding_dim": 0}, "embedding_dim"),
]


@pytest.mark.parametrize(("kw", "field"), BAD_ARCHS)
def test_architecture_errors_name_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError) as err:
        make(**kw)
    assert field in str(err.value)


BAD_GENES = [
    ({"op": "mlpp", "inputs": ("dense",)}, "op"),
    ({"op": "mlp", "inputs": ("dense",), "params": {}}, "missing 'width'"),
    ({"op": "mlp", "inputs": ("dense",), "params": {"width": 8, "widht": 3}}, "unknown ['widht']"),
    ({"op": "mlp", "inputs": ("dense",), "params": {"width": 0}}, "params['width']"),
    ({"op": "mlp", "inputs": ("dense",), "params": {"width": 8, "num_layers": True}}, "params['num_layers']"),
    ({"op": "mlp", "inputs": ("dense", "dense"), "params": {"width": 8}}, "inputs"),
    ({"op": "mlp", "inputs": ("wide",), "params": {"width": 8}}, "inputs[0]"),
    ({"op": "mlp", "inputs": (), "params": {"width": 8}}, "inputs"),
    ({"op": "mlp", "inputs": ("dense",), "params": {"width": {"a": 1}}}, "params['width']"),
    ({"op": "dot", "inputs": ("sparse",), "tokens": 0}, "tokens"),
]


@pytest.mark.parametrize(("kw", "field"), BAD_GENES)
def test_gene_errors_name_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError) as err:
        BlockGene(**kw)
    assert field in str(err.value)


def test_from_dict_errors_name_block_and_key() -> None:
    d = make().to_dict()
    d["blocks"][1]["params"]["num_heads"] = "two"
    d["blocks"][0]["params"]["width"] = -1
    with pytest.raises(ValueError, match=r"blocks\[0\]\.params\['width'\]"):
        Architecture.from_dict(d)
    with pytest.raises(ValueError, match="unknown keys"):
        Architecture.from_dict({**make().to_dict(), "extra": 1})
    with pytest.raises(ValueError, match=r"head\.widths\[0\]"):
        Architecture.from_dict({**make().to_dict(), "head": {"inputs": [2], "widths": [0]}})


def test_dcn_full_rank_zero_is_allowed_but_negative_is_not() -> None:
    assert BlockGene("dcn", ("dense",), {"low_rank": 0}).params["low_rank"] == 0
    with pytest.raises(ValueError, match="low_rank"):
        BlockGene("dcn", ("dense",), {"low_rank": -1})


def test_rocs_share_round_trips_and_is_written_only_when_set() -> None:
    shared = make(rocs=True, rocs_share=0.75)
    back = Architecture.from_json(shared.to_json())
    assert back == shared and back.hash == shared.hash and back.rocs_share == 0.75
    assert json.loads(shared.to_json())["rocs_share"] == 0.75
    assert shared.hash != make(rocs=True).hash
    assert type(make(rocs=True, rocs_share=np.float64(0.75)).rocs_share) is float  # plain float in JSON
    for arch in (make(), make(rocs=True)):
        assert "rocs_share" not in arch.to_json() and "rocs_share" not in arch.to_json(indent=2)
        assert Architecture.from_json(arch.to_json()).rocs_share is None


def test_hash_without_a_share_is_the_hash_of_the_json_of_before() -> None:
    """An architecture without a share hashes as before the field existed: the sha256 of the JSON
    of its four keys, written here by hand."""
    arch = make(rocs=True)
    old = {
        "blocks": [
            {"op": "mlp", "inputs": ["dense"], "tokens": 1,
             "params": {"activation": "relu", "norm": "layernorm", "num_layers": 1, "width": 8}},
            {"op": "attention", "inputs": ["sparse", 0], "tokens": 2, "params": {"ffn": True, "num_heads": 2}},
            {"op": "dhen", "inputs": [1], "tokens": 1,
             "params": {"combine": "concat", "modules": ["dot", "linear"], "out_fields": 3}},
        ],
        "head": {"inputs": [2, 0], "widths": [16, 8]},
        "embedding_dim": 4,
        "rocs": True,
    }
    text = json.dumps(old, sort_keys=True, separators=(",", ":"))
    assert arch.to_json() == text
    assert arch.hash == hashlib.sha256(text.encode()).hexdigest()[:16]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"rocs_share": 0.5}, "rocs is False"),
        ({"rocs": True, "rocs_share": 1.0}, r"\(0, 1\)"),
        ({"rocs": True, "rocs_share": 0.0}, r"\(0, 1\)"),
        ({"rocs": True, "rocs_share": float("nan")}, r"\(0, 1\)"),
        ({"rocs": True, "rocs_share": "0.5"}, r"\(0, 1\)"),
        ({"rocs": True, "rocs_share": True}, r"\(0, 1\)"),
        ({"rocs": True, "rocs_share": 1}, r"\(0, 1\)"),
    ],
)
def test_bad_rocs_share_names_the_field(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=rf"rocs_share: .*{match}"):
        make(**kw)
    d = {**make().to_dict(), **kw}
    with pytest.raises(ValueError, match="rocs_share"):
        Architecture.from_dict(d)
