"""Baselines: each builds and trains a step, has its published structure, and lies in ``engineer``."""

from __future__ import annotations

import pytest
import torch

from rankitect.data.spec import FeatureSpec
from rankitect.space.baselines import BASELINES, engineer_space_for, get_baseline
from rankitect.space.builder import build_model
from rankitect.space.space import get_space
from rankitect.space.testing import tiny_batch, tiny_spec

SPECS = {"dense": tiny_spec(), "no_dense": tiny_spec(n_dense=0)}


@pytest.mark.parametrize("kind", SPECS)
@pytest.mark.parametrize("name", sorted(BASELINES))
def test_baseline_builds_trains_and_is_contained(name: str, kind: str) -> None:
    spec = SPECS[kind]
    arch = get_baseline(name, spec)
    model = build_model(arch, spec)
    batch = tiny_batch(spec, 4)
    logits = model(batch)
    torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels).backward()
    assert logits.shape == (4,)
    assert all(p.grad is not None for p in model.parameters())
    assert engineer_space_for(spec).contains(arch)
    assert not get_space("nasrec", use_dense=spec.n_dense > 0).contains(arch)


@pytest.mark.parametrize("dim", [8, 16, 32])
def test_baselines_scale_with_embedding_dim(dim: int) -> None:
    spec = tiny_spec()
    for name in BASELINES:
        arch = get_baseline(name, spec, embedding_dim=dim)
        assert arch.embedding_dim == dim
        assert engineer_space_for(spec, embedding_dim=dim).contains(arch)


def ops(name: str, spec: FeatureSpec) -> list[str]:
    return [g.op for g in get_baseline(name, spec).blocks]


def test_published_structure() -> None:
    spec = tiny_spec()
    assert ops("dlrm", spec) == ["mlp", "dot"]
    assert get_baseline("dlrm", spec).head.inputs == (1, 0)  # dot products next to the bottom output
    dcn = get_baseline("dcnv2", spec).blocks[0]
    assert dcn.inputs == ("sparse", "dense") and dcn.params["num_layers"] == 3 and dcn.params["low_rank"] == 0
    assert ops("deepfm", spec) == ["fm", "mlp"] and get_baseline("deepfm", spec).head.widths == ()
    assert ops("autoint", spec) == ["attention"] * 3
    assert not any(g.params["ffn"] for g in get_baseline("autoint", spec).blocks)
    assert ops("wukong", spec) == ["wukong"] * 3
    assert ops("dhen", spec) == ["dhen"] * 2


def test_unknown_baseline() -> None:
    with pytest.raises(ValueError, match="unknown baseline 'dlrm2'"):
        get_baseline("dlrm2", tiny_spec())
