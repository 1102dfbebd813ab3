"""ROCS scoring of history models: the history looked up and encoded once per request."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from rankitect.serve import rocs_cost, score_requests
from rankitect.space import build_model, get_space
from rankitect.space.architecture import Architecture, BlockGene, HeadGene
from rankitect.space.testing import tiny_batch, tiny_spec
from tests.space.conftest import SMALL_ENGINEER


def test_shared_scoring_of_history_architectures_equals_per_row_scoring() -> None:
    spec = tiny_spec(history=6)
    space = get_space("engineer", **SMALL_ENGINEER, rocs=True, history="h0")
    batch, rng, seen = tiny_batch(spec, 12, per_request=4), np.random.default_rng(2), set()
    for _ in range(40):
        arch = space.decode(space.sample(rng))
        seen |= {g.op for g in arch.blocks if g.in_kind == "sequence"}
        model = build_model(arch, spec).eval()
        with torch.no_grad():
            plain = model(batch)
        shared = score_requests(model, batch)
        assert torch.allclose(shared, plain, atol=1e-5 * max(1.0, float(plain.abs().max()))), arch.to_json()
    assert seen == {"history_pool", "target_attention", "history_transformer", "history_cross"}


def _dca(L: int, D: int, rocs: bool = True) -> Architecture:
    genes = (BlockGene("history_cross", ("history:h0",), {"num_heads": 2}),
             BlockGene("mlp", ("sparse", "dense", 0), {"width": 8}))
    return Architecture(genes, HeadGene((1,), (4,)), D, rocs=rocs)


def test_deep_cross_attention_encodes_the_history_once_per_request() -> None:
    L, D = 6, 4
    spec = tiny_spec(history=L)
    arch = _dca(L, D)
    cost = rocs_cost(arch, spec)
    block = build_model(arch, spec).blocks[0]
    encoder = block.encoder.flops(L) + 2 * L * D * 2 * D  # self-attention, then K and V
    per_query = 2 * D * D + 2 * (2 * L * D) + 2 * D * D  # query, scores and mix, output projection
    assert cost.per_request >= encoder  # the encoder and K/V: once per request
    assert cost.per_candidate < build_model(arch, spec).flops() - encoder + per_query
    model, batch = build_model(arch, spec).eval(), tiny_batch(spec, 12, per_request=4)
    with FlopCounterMode(display=False) as counter:  # what runs: 3 requests, 12 candidates
        score_requests(model, batch)
    assert counter.get_total_flops() == 3 * cost.per_request + 12 * cost.per_candidate


def test_an_empty_history_scores_without_nan() -> None:
    spec = tiny_spec(history=4)
    batch = tiny_batch(spec, 8, per_request=2)
    batch = type(batch)(batch.dense, batch.sparse, batch.labels, batch.request_ids,
                        history=type(batch.history).from_lengths_sync(
                            keys=["h0"], values=torch.zeros(0, dtype=torch.int64),
                            lengths=torch.zeros(8, dtype=torch.int32)))
    for op in ("history_pool", "target_attention", "history_transformer", "history_cross"):
        arch = Architecture((BlockGene(op, ("history:h0",)), BlockGene("mlp", ("sparse", 0), {"width": 4})),
                            HeadGene((1,)), 4, rocs=True)
        model = build_model(arch, spec).eval()
        assert torch.isfinite(score_requests(model, batch)).all() and torch.isfinite(model(batch)).all()
