"""The supernet's memory estimate against the bytes a trained supernet really holds, and the refusal."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rankitect.config import TrainConfig
from rankitect.data.spec import FeatureSpec, SparseFeature
from rankitect.errors import ConfigError
from rankitect.supernet.train import SupernetTrainer, batches, build_supernet, check_supernet_memory
from rankitect.space import get_space
from rankitect.supernet.memory import estimate_supernet_memory
from rankitect.space.testing import tiny_spec
from tests.search.tiny_data import tiny_click_data
from tests.space.conftest import SMALL_NASREC, small_space


def held_bytes(supernet: torch.nn.Module, trainer: SupernetTrainer) -> int:
    """Bytes of every weight and every optimizer state tensor that training allocated."""
    tensors = list(supernet.parameters())
    tensors += [t for m, v, _ in trainer.dense_opt.state.values() for t in (m, v)]
    tensors += [t for state in trainer.sparse_opt.state.values() for t in state.values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("preset", ["nasrec", "engineer"])
def test_estimate_is_within_20_percent_of_a_trained_supernet(preset, tmp_path):
    data = tiny_click_data(tmp_path / "data", rows=256)
    space = small_space(preset)
    estimate = estimate_supernet_memory(space, data.spec)
    supernet = build_supernet(space, data.spec, seed=0)
    trainer = SupernetTrainer(supernet, TrainConfig(batch_size=32, progress=False), data.split("train").ctr)
    rng, stream = np.random.default_rng(0), batches(data.split("train"), 32, 0)
    for step in range(60):  # widest paths and uniform ones, as one-shot training draws them
        trainer.step(next(stream), supernet.widest_path(rng) if step % 2 else space.sample(rng))
    measured = held_bytes(supernet, trainer)
    assert estimate.weights == sum(p.numel() * 4 for p in supernet.parameters())
    assert abs(estimate.total - measured) <= 0.2 * measured, (estimate.total, measured)


def test_over_budget_refusal_names_the_keys_that_shrink_it():
    space = small_space("engineer")
    with pytest.raises(ConfigError) as info:
        check_supernet_memory(space, tiny_spec(), 1e-6, "auto")
    message = str(info.value)
    for key in ("runtime.memory_budget", "search.flops_range", "search.space", "data.vocab_size"):
        assert key in message
    assert message.index("search.flops_range") < message.index("data.vocab_size")  # the dense part is larger
    assert check_supernet_memory(space, tiny_spec(), 100.0, "auto").total > 0  # within budget: no error


def test_refusal_puts_the_tables_first_when_they_are_the_bulk():
    spec = FeatureSpec(dense=(), sparse=tuple(SparseFeature(f"s{i}", 200_000) for i in range(3)), name="wide")
    with pytest.raises(ConfigError) as info:
        check_supernet_memory(get_space("nasrec", **SMALL_NASREC, use_dense=False), spec, 1e-3, None)
    message = str(info.value)
    assert message.index("data.vocab_size") < message.index("search.flops_range")
