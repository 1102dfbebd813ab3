"""Shared fixtures: a tiny feature spec (4 dense + 6 sparse) and small test menus for the presets."""

from __future__ import annotations

import pytest

from rankitect.data.batch import Batch
from rankitect.data.spec import FeatureSpec
from rankitect.space.space import SearchSpace, get_space
from rankitect.space.testing import tiny_batch, tiny_spec

# Small menus keep 1000 builds per preset fast; the structure (ops, connections) is the full one.
SMALL_NASREC = {"widths": (8, 16, 24), "tokens": (2, 4, 6), "merge_tokens": 2, "embedding_dim": 4}
SMALL_ENGINEER = {
    "embedding_dim": 4,
    "widths": (8, 16),
    "layer_widths": (8, 16),
    "fields": (2, 4),
    "wukong_ranks": (2, 3),
    "cross_ranks": (0, 4, 8),
    "heads": (1, 2),
}


@pytest.fixture
def spec() -> FeatureSpec:
    return tiny_spec()


@pytest.fixture
def batch(spec: FeatureSpec) -> Batch:
    return tiny_batch(spec, 4)


def small_space(name: str) -> SearchSpace:
    return get_space(name, **(SMALL_NASREC if name == "nasrec" else SMALL_ENGINEER))
