"""Histories in genotypes, the engineer space and the baselines: present only for data with a history."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rankitect.data.spec import SequenceFeature
from rankitect.search.proposing.sizing import contains_baselines, space_for
from rankitect.space.architecture import Architecture, BlockGene, HeadGene
from rankitect.space.baselines import (
    DEFAULT_BASELINES, baselines_for, engineer_space_for, get_baseline, with_history_baselines,
)
from rankitect.space.builder import build_model
from rankitect.space.space import get_space
from rankitect.space.testing import tiny_batch, tiny_spec

from .conftest import SMALL_ENGINEER

HISTORY_OPS = {"history_pool", "target_attention", "history_transformer", "history_cross"}


def test_a_space_for_data_without_history_is_the_one_without_history_options() -> None:
    spec = tiny_spec()
    for flops_range in (None, "auto"):
        space = space_for("engineer", spec, flops_range)
        assert not any(label.startswith("history") for label in space.choices)
        assert "history" not in space.options
    plain, routed = engineer_space_for(spec), get_space("engineer", use_dense=True)
    assert plain.to_dict() == routed.to_dict()
    r1, r2 = np.random.default_rng(3), np.random.default_rng(3)
    assert [plain.sample(r1) for _ in range(5)] == [routed.sample(r2) for _ in range(5)]
    assert baselines_for(spec) == list(DEFAULT_BASELINES)


def test_history_samples_round_trip_build_and_train_one_step() -> None:
    spec = tiny_spec(history=5)
    space = get_space("engineer", **SMALL_ENGINEER, history="h0")
    batch, rng = tiny_batch(spec, 6), np.random.default_rng(0)
    seen = set()
    for _ in range(300):
        arch = space.decode(space.sample(rng))
        assert Architecture.from_json(arch.to_json()) == arch and space.decode(space.encode(arch)) == arch
        seen |= {g.op for g in arch.blocks} & HISTORY_OPS
        model = build_model(arch, spec)
        logits = model(batch)
        assert torch.isfinite(logits).all()
        torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels).backward()
        assert not [n for n, p in model.named_parameters() if p.grad is None]
    assert seen == HISTORY_OPS


def test_a_history_without_a_shared_table_is_pooled_only() -> None:
    base = tiny_spec()
    spec = type(base)(dense=base.dense, sparse=base.sparse, sequence=(SequenceFeature("tags", 4, 30),))
    space = space_for("engineer", spec, None)
    assert space.choices["history.op"].options == ("none", "pool")
    assert baselines_for(spec) == list(DEFAULT_BASELINES)
    arch = Architecture((BlockGene("history_pool", ("history:tags",)), BlockGene("mlp", ("sparse", 0), {"width": 4})),
                        HeadGene((1,)), 4)
    model = build_model(arch, spec)
    assert model.history.tables["tags"].weight.shape == (30, 4)  # a table of its own
    assert any(p is model.history.tables["tags"].weight for p in model.sparse_parameters())
    with pytest.raises(ValueError, match="reads the candidate item, but history 'tags' shares no sparse feature"):
        build_model(Architecture((BlockGene("history_cross", ("history:tags",)),), HeadGene((0,)), 4), spec)


def test_din_and_bst_exist_for_history_data_lie_in_its_space_and_train() -> None:
    spec = tiny_spec(history=5)
    assert contains_baselines(space_for("engineer", spec, None), spec) == dict.fromkeys(baselines_for(spec), True)
    batch = tiny_batch(spec, 6)
    for name, op in (("din", "target_attention"), ("bst", "history_transformer")):
        arch = get_baseline(name, spec)
        assert [g.op for g in arch.blocks] == [op] and arch.blocks[0].inputs == ("history:h0",)
        logits = build_model(arch, spec)(batch)
        logits.sum().backward()
        with pytest.raises(ValueError, match="reads a user history"):
            get_baseline(name, tiny_spec())
    assert with_history_baselines(DEFAULT_BASELINES, spec) == [*DEFAULT_BASELINES, "din", "bst"]
    assert with_history_baselines(DEFAULT_BASELINES, tiny_spec()) == list(DEFAULT_BASELINES)


def test_a_history_reference_is_read_by_a_history_block_only() -> None:
    with pytest.raises(ValueError, match="a history block .* reads exactly one 'history:<name>'"):
        Architecture((BlockGene("mlp", ("history:h0", "dense"), {"width": 4}),), HeadGene((0,)), 4)
    with pytest.raises(ValueError, match="a history block .* reads exactly one"):
        Architecture((BlockGene("history_pool", ("sparse",)),), HeadGene((0,)), 4)
    with pytest.raises(ValueError, match="only a history block reads"):
        Architecture((BlockGene("mlp", ("dense",), {"width": 4}),), HeadGene((0, "history:h0")), 4)
    with pytest.raises(ValueError, match="must be an earlier block index"):
        BlockGene("history_pool", ("history:not a name",))
    arch = Architecture((BlockGene("history_pool", ("history:h0",)),), HeadGene((0,)), 4)
    with pytest.raises(ValueError, match="no sequence feature 'h0'"):
        build_model(arch, tiny_spec())
