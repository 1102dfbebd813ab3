"""ROCS serving: request-shared scoring equals per-candidate scoring; its FLOPs are what runs.

Equality is checked in float32: scores (sigmoid of the logits) within 1e-5 absolute, logits within
1e-5 of the largest |logit| (random initializations reach logits of ~1e3, where float32 itself
resolves only ~1e-4; the split sums in another order, measured at most 3e-6 relative).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from rankitect.blocks import build_block
from rankitect.data.batch import Batch, make_batch
from rankitect.data.spec import DenseFeature, FeatureSpec, SparseFeature
from rankitect.serve import request_rows, rocs_cost, rocs_flops, score_requests
from rankitect.blocks.split import Split, fallback
from rankitect.space import BASELINES, build_model, flops, get_baseline, get_space
from rankitect.space.architecture import Architecture, BlockGene, HeadGene

# Small menus keep the builds fast; the ops and connections are the presets' full ones.
SMALL_NASREC = {"widths": (8, 16, 24), "tokens": (2, 4, 6), "merge_tokens": 2, "embedding_dim": 4}
SMALL_ENGINEER = {"embedding_dim": 4, "widths": (8, 16), "layer_widths": (8, 16), "fields": (2, 4),
                  "wukong_ranks": (2, 3), "cross_ranks": (0, 4, 8), "heads": (1, 2)}
SIZES = (1, 3, 5, 2, 4)  # candidates per request, a one-candidate request included
REQUEST_IDS = (7, 3, 9, 1, 3)  # not sorted; id 3 twice (two runs: two requests)


@pytest.fixture(scope="module")
def spec() -> FeatureSpec:
    """4 dense and 6 sparse features, half of each request side (so request pairs exist); the dense
    ones with training statistics (models standardize them first, shared scoring too)."""
    return FeatureSpec(
        dense=tuple(DenseFeature(f"d{i}", "request" if i % 2 else "candidate", mean=0.5 * i - 0.7, std=0.5 + 0.3 * i)
                    for i in range(4)),
        sparse=tuple(SparseFeature(f"s{i}", 5 + 3 * i, "request" if i < 3 else "candidate") for i in range(6)),
    )


def request_batch(spec: FeatureSpec, seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    B = sum(SIZES)
    first = np.repeat(np.cumsum(SIZES) - SIZES, SIZES)
    dense = rng.standard_normal((B, spec.n_dense)).astype(np.float32)
    ids = np.stack([rng.integers(0, f.vocab_size, B) for f in spec.sparse], axis=1)
    for j, f in enumerate(spec.dense):
        dense[:, j] = dense[first, j] if f.side == "request" else dense[:, j]
    for j, f in enumerate(spec.sparse):
        ids[:, j] = ids[first, j] if f.side == "request" else ids[:, j]
    return make_batch(dense, ids, np.zeros(B), np.repeat(REQUEST_IDS, SIZES), keys=spec.sparse_names)


SHARES = (None, 0.5, 0.9)


def rocs_archs(spec: FeatureSpec, per_space: int = 12, share: float | None = None) -> list[Architecture]:
    """The baselines and preset samples, ROCS-masked with request share ``share``."""
    archs = [dataclasses.replace(get_baseline(n, spec, embedding_dim=4), rocs=True) for n in BASELINES]
    for name, menus in (("nasrec", SMALL_NASREC), ("engineer", SMALL_ENGINEER)):
        space = get_space(name, rocs=True, **menus)
        rng = np.random.default_rng(1)
        archs += [space.decode(space.sample(rng)) for _ in range(per_space)]
    return [dataclasses.replace(a, rocs_share=share) for a in archs]


def assert_same_scores(got: torch.Tensor, ref: torch.Tensor) -> None:
    assert (torch.sigmoid(got) - torch.sigmoid(ref)).abs().max() <= 1e-5
    assert (got - ref).abs().max() <= 1e-5 * ref.abs().max().clamp_min(1.0)


def test_request_rows_follow_runs_of_ids() -> None:
    index, first = request_rows(torch.tensor([4, 4, 2, 4, 4, 4]))
    assert index.tolist() == [0, 0, 1, 2, 2, 2] and first.tolist() == [0, 2, 3]


@pytest.mark.parametrize("share", SHARES)
def test_shared_scoring_equals_per_candidate_scoring(spec: FeatureSpec, share: float | None) -> None:
    batch = request_batch(spec)
    ops = set()
    for i, arch in enumerate(rocs_archs(spec, per_space=12 if share is None else 6, share=share)):
        torch.manual_seed(i)
        model = build_model(arch, spec).eval()
        with torch.no_grad():
            assert_same_scores(score_requests(model, batch), model(batch))
        ops |= {g.op for g in arch.blocks}
    assert ops == {"mlp", "efc", "dot", "fm", "dcn", "attention", "wukong", "dhen", "gating", "sum", "buckets"}


@pytest.mark.parametrize("share", SHARES)
def test_flops_counted_on_meta_are_the_flops_that_run(spec: FeatureSpec, share: float | None) -> None:
    batch = request_batch(spec)
    archs = rocs_archs(spec, per_space=1, share=share)
    for arch in [archs[i] for i in (0, 3, 4, 5, 6, 7)]:  # dlrm, autoint, wukong, dhen, nasrec, engineer
        cost = rocs_cost(arch, spec)
        with FlopCounterMode(display=False) as counter:
            score_requests(build_model(arch, spec), batch)
        assert counter.get_total_flops() == len(SIZES) * cost.per_request + sum(SIZES) * cost.per_candidate
        # Never more than every row computing everything; sharing pays more with more candidates.
        assert 0 < cost.per_example(1) <= flops(arch, spec)
        assert cost.per_example(100) <= cost.per_example(10)


def test_flops_of_a_masked_mlp_by_hand(spec: FeatureSpec) -> None:
    # mlp on 4 dense (2 request) -> 8 units, 4 of them request side; head 8 -> 1.
    arch = Architecture((BlockGene("mlp", ("dense",), {"width": 8}),), HeadGene((0,), ()), 4, rocs=True)
    cost = rocs_cost(arch, spec)
    # Per request: the request inputs times every output (2*2*8) and the head's request columns (2*4*1).
    assert cost.per_request == 2 * 2 * 8 + 2 * 4
    # Per candidate: candidate inputs to candidate outputs (2*2*4), head's candidate columns (2*4*1).
    assert cost.per_candidate == 2 * 2 * 4 + 2 * 4
    assert flops(arch, spec) == 2 * 4 * 8 + 2 * 8
    assert rocs_flops(arch, spec, 10) == (pytest.approx(24 + 40 / 10), 40)


def test_flops_of_a_masked_mlp_and_masked_head_by_hand(spec: FeatureSpec) -> None:
    # mlp on 4 dense (2 request) -> 8 units, round(0.75 * 8) = 6 request side; head 8 (6 request)
    # -> 4 hidden units, round(0.75 * 4) = 3 request side; then 4 -> 1.
    arch = Architecture((BlockGene("mlp", ("dense",), {"width": 8}),), HeadGene((0,), (4,)), 4, rocs=True,
                        rocs_share=0.75)
    cost = rocs_cost(arch, spec)
    # Per request: request inputs times every output of each map (2*2*8, 2*6*4, 2*3*1).
    assert cost.per_request == 2 * 2 * 8 + 2 * 6 * 4 + 2 * 3 * 1
    # Per candidate: candidate inputs to candidate outputs (2*2*2, 2*2*1) and the logit's (2*1*1).
    assert cost.per_candidate == 2 * 2 * 2 + 2 * 2 * 1 + 2 * 1 * 1
    assert flops(arch, spec) == 2 * 4 * 8 + 2 * 8 * 4 + 2 * 4 * 1
    # The proportional rule keeps half of each layer candidate side: more per-candidate work.
    assert rocs_cost(dataclasses.replace(arch, rocs_share=None), spec).per_candidate > cost.per_candidate


def test_larger_share_gives_fewer_per_candidate_flops(spec: FeatureSpec) -> None:
    archs = {share: rocs_archs(spec, per_space=2, share=share) for share in (0.5, 0.9)}
    low = [rocs_cost(a, spec).per_candidate for a in archs[0.5]]
    high = [rocs_cost(a, spec).per_candidate for a in archs[0.9]]
    assert all(h <= lo for h, lo in zip(high, low)), list(zip(high, low))
    assert sum(high) < sum(low)


def test_masked_head_serves_request_units_once(spec: FeatureSpec) -> None:
    """A deep masked head reading blocks and raw inputs scores like the model, at every share."""
    genes = (BlockGene("efc", ("sparse",), {"out_fields": 4}), BlockGene("mlp", ("dense", 0), {"width": 6}))
    batch = request_batch(spec, seed=3)
    for share in SHARES:
        arch = Architecture(genes, HeadGene((1, 0, "dense"), (7, 5)), 4, rocs=True, rocs_share=share)
        torch.manual_seed(0)
        model = build_model(arch, spec).eval()
        assert model.head.request_out > 0
        with torch.no_grad():
            assert_same_scores(score_requests(model, batch), model(batch))


def test_fallback_gives_what_the_split_forward_gives() -> None:
    block = build_block("mlp", (6,), {"width": 5, "num_layers": 2}, request_in=2)
    index, first = torch.tensor([0, 0, 1, 1, 1]), torch.tensor([0, 2])
    x = Split(torch.randn(2, 2), torch.randn(5, 4), index, first)
    a, b = block.forward_split(x), fallback(block, x)
    assert a.request_width == b.request_width == block.request_out
    assert torch.allclose(a.req, b.req, atol=1e-6) and torch.allclose(a.cand, b.cand, atol=1e-6)


def test_errors_name_the_problem(spec: FeatureSpec) -> None:
    batch = request_batch(spec)
    plain = get_baseline("dlrm", spec, embedding_dim=4)
    with pytest.raises(ValueError, match="not ROCS-masked"):
        score_requests(build_model(plain, spec), batch)
    with pytest.raises(ValueError, match="not ROCS-masked"):
        rocs_cost(plain, spec)
    model = build_model(dataclasses.replace(plain, rocs=True), spec)
    ids = batch.sparse_ids().clone()
    ids[2, 1] = (ids[1, 1] + 1) % spec.sparse[1].vocab_size  # rows 1 and 2 share a request
    broken = make_batch(batch.dense, ids, batch.labels, batch.request_ids, keys=spec.sparse_names)
    with pytest.raises(ValueError, match="'s1' differs within a request"):
        score_requests(model, broken)


@pytest.mark.parametrize("name", ["nasrec", "engineer"])
def test_spaces_with_rocs_hold_only_rocs_architectures(name: str) -> None:
    menus = SMALL_NASREC if name == "nasrec" else SMALL_ENGINEER
    space, plain = get_space(name, rocs=True, **menus), get_space(name, **menus)
    rng = np.random.default_rng(0)
    for _ in range(10):
        arch = space.decode(space.sample(rng))
        assert arch.rocs and space.contains(arch) and not plain.contains(arch)
        assert space.mutate(arch, rng).rocs
        assert plain.contains(dataclasses.replace(arch, rocs=False, rocs_share=None))
