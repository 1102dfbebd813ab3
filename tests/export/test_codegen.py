"""Generated ``model.py`` against the rankitect model it came from, and the source's safety checks."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from rankitect.blocks import BLOCKS
from rankitect.data.spec import DenseFeature, FeatureSpec, SparseFeature
from rankitect.export import audit_source, generate_source
from rankitect.space.architecture import Architecture, BlockGene, HeadGene
from rankitect.space.baselines import BASELINES
from rankitect.space.testing import tiny_batch, tiny_spec
from tests.export.archs import (
    ALL_OPS, DENSE_ONLY, HISTORY_OPS, SMALL_ENGINEER, SMALL_NASREC, SPARSE_ONLY, every_mask, sampled,
)
from tests.export.conftest import assert_same_logits, exported_model, perturbed_model

HAND_WRITTEN = [a for arch in (ALL_OPS, DENSE_ONLY, SPARSE_ONLY) for a in every_mask(arch)]


def test_hand_written_genotypes_use_every_op() -> None:
    assert {g.op for g in ALL_OPS.blocks} | {g.op for g in HISTORY_OPS.blocks} == set(BLOCKS)


@pytest.mark.parametrize("arch", every_mask(HISTORY_OPS), ids=lambda a: f"rocs={a.rocs}-share={a.rocs_share}")
def test_exported_history_model_equals_rankitect_model(arch: Architecture, tmp_path: Path) -> None:
    spec = tiny_spec(history=5)
    model = perturbed_model(arch, spec)
    exported = exported_model(arch, spec, model, tmp_path)
    for batch_size in (1, 6):
        assert_same_logits(model, exported, tiny_batch(spec, batch_size, seed=batch_size))


def test_sampled_history_architectures_and_history_baselines_export(tmp_path: Path) -> None:
    from rankitect.space.baselines import HISTORY_BASELINES

    spec = tiny_spec(history=4)
    batch = tiny_batch(spec, 6, seed=3)
    archs = sampled("engineer", {**SMALL_ENGINEER, "history": "h0"}, 6, seed=5)
    archs += [make(spec, 4) for make in HISTORY_BASELINES.values()]
    for i, arch in enumerate(archs):
        model = perturbed_model(arch, spec, seed=i)
        assert_same_logits(model, exported_model(arch, spec, model, tmp_path), batch)


@pytest.mark.parametrize("arch", HAND_WRITTEN, ids=lambda a: f"{a.hash}-rocs={a.rocs}-share={a.rocs_share}")
def test_exported_model_equals_rankitect_model(arch: Architecture, tmp_path: Path) -> None:
    spec = tiny_spec()
    model = perturbed_model(arch, spec)
    exported = exported_model(arch, spec, model, tmp_path)
    for batch_size in (1, 6):
        assert_same_logits(model, exported, tiny_batch(spec, batch_size, seed=batch_size))


@pytest.mark.parametrize("name,options", [("nasrec", SMALL_NASREC), ("engineer", SMALL_ENGINEER)])
def test_sampled_architectures_of_both_presets(name: str, options: dict, tmp_path: Path) -> None:
    spec = tiny_spec()
    batch = tiny_batch(spec, 6, seed=3)
    archs = sampled(name, options, 3, seed=7)
    for i, arch in enumerate(archs):
        for a in every_mask(arch):
            model = perturbed_model(a, spec, seed=i)
            assert_same_logits(model, exported_model(a, spec, model, tmp_path), batch)


def test_baselines_export(tmp_path: Path) -> None:
    spec = tiny_spec()
    batch = tiny_batch(spec, 4)
    for make in BASELINES.values():
        for arch in (make(spec, 4), dataclasses.replace(make(spec, 4), rocs=True, rocs_share=0.9)):
            model = perturbed_model(arch, spec)
            assert_same_logits(model, exported_model(arch, spec, model, tmp_path), batch)


# torch and a few standard library modules (the blocks' own imports); never os, subprocess and the like
ALLOWED = {"__future__", "collections", "dataclasses", "functools", "inspect", "json", "math", "typing", "torch"}


def imported_modules(source: str) -> set[str]:
    tree = ast.parse(source)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
    return found


def test_source_imports_only_torch_and_a_few_standard_modules_and_reads_like_the_genotype() -> None:
    source = generate_source(ALL_OPS, tiny_spec())
    assert {m.split(".")[0] for m in imported_modules(source)} <= ALLOWED
    forward = source[source.index("    def forward(self, dense"):]
    gene_lines = [line for line in forward.splitlines() if "= self.blocks[" in line]
    assert len(gene_lines) == len(ALL_OPS.blocks)
    for i, (line, gene) in enumerate(zip(gene_lines, ALL_OPS.blocks)):
        assert line.strip().startswith(f"x{i} = self.blocks[{i}](*self.adapters[{i}]([") and f"# {gene.op} ->" in line
    tree = ast.parse(source)
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    assert "ExportedModel" in classes and "Wukong" in classes
    assert "Wukong" not in generate_source(DENSE_ONLY, tiny_spec())  # only the blocks it uses


HOSTILE = 'x"); import os; os.system("touch pwned")#'


def tampered(arch: Architecture, index: int, **changes: object) -> Architecture:
    """``arch`` with gene ``index`` changed behind its validation (as a hostile object could be)."""
    gene = arch.blocks[index]
    for key, value in changes.items():
        object.__setattr__(gene, key, value)
    return arch


def one_gene(op: str, params: dict, inputs: tuple = ("dense",)) -> Architecture:
    return Architecture((BlockGene(op, inputs, params),), embedding_dim=4)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Architecture.from_dict({"blocks": [{"op": HOSTILE, "inputs": ["dense"]}]}),
        lambda: one_gene("mlp", {"width": 4, "activation": HOSTILE}),
        lambda: one_gene("mlp", {"width": 4, "norm": "layernorm\nimport os"}),
        lambda: one_gene("dhen", {"modules": ["dot", HOSTILE]}, ("sparse",)),
        lambda: one_gene("dhen", {"modules": ["dot", "fm"], "combine": "concat\n"}, ("sparse",)),
        lambda: tampered(one_gene("mlp", {"width": 4}), 0, op=HOSTILE),
        lambda: tampered(one_gene("mlp", {"width": 4}), 0, op="mlp\n"),
        lambda: tampered(one_gene("mlp", {"width": 4}), 0, params={"width": HOSTILE}),
        lambda: tampered(one_gene("mlp", {"width": 4}), 0, params={"width": 4, HOSTILE: 1}),
        lambda: tampered(one_gene("mlp", {"width": 4}), 0, params={"width": 4.0, "num_layers": 1,
                                                                    "activation": "relu", "norm": "none"}),
        lambda: tampered(one_gene("attention", {}, ("sparse",)), 0, params={"num_heads": 1, "ffn": 1}),
        lambda: tampered(one_gene("mlp", {"width": 4}), 0, inputs=(HOSTILE,)),
        lambda: tampered(one_gene("mlp", {"width": 4}), 0, tokens=True),
    ],
)
def test_hostile_genotype_is_refused(make, tmp_path: Path) -> None:
    try:
        arch = make()
    except ValueError:
        return  # refused already by the genotype's own validation
    with pytest.raises(ValueError):
        generate_source(arch, tiny_spec())
    assert not (tmp_path / "pwned").exists()


class SneakyFloat(float):
    def __repr__(self) -> str:
        return "__import__('os').system('touch pwned')"


@pytest.mark.parametrize("share", [HOSTILE, "0.5", "__import__('os')", float("nan"), float("inf"), 1.5, 0.0,
                                   1.0, -0.5, True, 1, [0.5], SneakyFloat(0.5)])
def test_hostile_rocs_share_is_refused(share: object, tmp_path: Path) -> None:
    arch = Architecture((BlockGene("mlp", ("dense",), {"width": 4}),), HeadGene((0,), (3,)), 4, rocs=True,
                        rocs_share=0.5)
    object.__setattr__(arch, "rocs_share", share)  # past the genotype's own validation
    with pytest.raises(ValueError, match="rocs_share"):
        generate_source(arch, tiny_spec())
    assert not (tmp_path / "pwned").exists()


def test_share_reaches_the_source_as_a_float_literal() -> None:
    arch = Architecture((BlockGene("mlp", ("dense",), {"width": 4}),), HeadGene((0,), (3,)), 4, rocs=True,
                        rocs_share=0.75)
    source = generate_source(arch, tiny_spec())
    assert "MLP(" in source and "rocs_share=0.75)" in source and "Head(4, [3], request_in=" in source
    plain = generate_source(dataclasses.replace(arch, rocs_share=None), tiny_spec())
    assert "rocs_share=" not in plain[plain.index("class ExportedModel"):]


def test_int_subclass_with_its_own_repr_is_refused() -> None:
    class Sneaky(int):
        def __repr__(self) -> str:
            return "__import__('os').system('true')"

    arch = tampered(one_gene("mlp", {"width": 4}), 0,
                    params={"width": Sneaky(4), "num_layers": 1, "activation": "relu", "norm": "none"})
    with pytest.raises(ValueError, match="width"):
        generate_source(arch, tiny_spec())


def test_feature_names_never_reach_the_source() -> None:
    spec = FeatureSpec(dense=(DenseFeature("d0"),), sparse=(SparseFeature("s0", 5), SparseFeature("u0", 4, side="request")))
    crafted = {"dense": HOSTILE + "\n", "sparse": HOSTILE + "_s", "request": '"""; import os #'}
    object.__setattr__(spec.dense[0], "name", crafted["dense"])
    object.__setattr__(spec.sparse[0], "name", crafted["sparse"])
    object.__setattr__(spec.sparse[1], "name", crafted["request"])
    arch = Architecture((BlockGene("dot", ("sparse", "dense")),), HeadGene((0, "dense"), ()), 4, rocs=True)
    source = generate_source(arch, spec)
    assert not any(name in source for name in crafted.values())
    assert "import os" not in source and "os.system" not in source
    assert {m.split(".")[0] for m in imported_modules(source)} <= ALLOWED


def test_crafted_feature_side_or_vocab_is_refused() -> None:
    spec = tiny_spec()
    object.__setattr__(spec.sparse[0], "vocab_size", "5); import os")
    with pytest.raises(ValueError, match="vocab_size"):
        generate_source(SPARSE_ONLY, spec)
    spec = tiny_spec()
    object.__setattr__(spec.dense[0], "side", "request\n")
    with pytest.raises(ValueError, match="side"):
        generate_source(DENSE_ONLY, spec)


@pytest.mark.parametrize(
    "source", ["import os", "from subprocess import run", "from . import model", "x = __import__('os')", "exec('1')"]
)
def test_audit_refuses_other_imports_and_dynamic_code(source: str) -> None:
    with pytest.raises(ValueError):
        audit_source("import torch\n" + source + "\n")
