"""Analytic FLOPs and parameter counts against torch's FlopCounterMode and the built modules."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from rankitect.data.batch import Batch
from rankitect.data.spec import FeatureSpec
from rankitect.space.architecture import Architecture, BlockGene, HeadGene
from rankitect.space.builder import build_model
from rankitect.space.flops import cost
from rankitect.space.space import get_space
from rankitect.space.testing import tiny_batch, tiny_spec

from .conftest import small_space

B = 4


def measured(arch: Architecture, spec: FeatureSpec, batch: Batch) -> tuple[float, int]:
    """(FLOPs per example counted by torch, exact parameter count) of the built model."""
    model = build_model(arch, spec)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(batch)
    return counter.get_total_flops() / B, sum(p.numel() for p in model.parameters())


def check(arch: Architecture, spec: FeatureSpec, batch: Batch) -> None:
    counted, n_params = measured(arch, spec, batch)
    c = cost(arch, spec)
    assert abs(c.flops - counted) <= 0.01 * counted, (arch.to_json(), c.flops, counted)
    assert c.params == n_params
    model = build_model(arch, spec, device="meta")
    assert c.dense_params == sum(p.numel() for p in model.dense_parameters())


ONE_BLOCK: list[tuple[str, tuple[Any, ...], dict[str, Any], int]] = [
    ("mlp", ("sparse", "dense"), {"width": 8, "num_layers": 2}, 1),
    ("efc", ("sparse", "dense"), {"out_fields": 3}, 2),
    ("dot", ("sparse", "dense"), {}, 1),
    ("fm", ("sparse",), {}, 1),
    ("dcn", ("sparse", "dense"), {"num_layers": 2, "low_rank": 0}, 1),
    ("dcn", ("sparse", "dense"), {"num_layers": 3, "low_rank": 5}, 1),
    ("attention", ("sparse", "dense"), {"num_heads": 2, "ffn": True}, 3),
    ("attention", ("sparse",), {"num_heads": 1, "ffn": False}, 1),
    ("wukong", ("sparse", "dense"), {"fmb_fields": 3, "lcb_fields": 2, "low_rank": 2, "mlp_width": 8}, 1),
    ("dhen", ("sparse",), {"modules": ("dot", "attention", "linear", "dcn", "fm"), "out_fields": 4}, 1),
    ("dhen", ("sparse", "dense"), {"modules": ("dot", "fm"), "combine": "sum", "out_fields": 7}, 1),
    ("gating", ("dense", "sparse"), {"width": 6}, 1),
    ("sum", ("sparse", "dense"), {"width": 6}, 1),
    ("buckets", ("dense",), {"dim": 4, "bins": 4}, 1),
    ("history_pool", ("history:h0",), {"mode": "mean"}, 1),
    ("target_attention", ("history:h0",), {"width": 6}, 1),
    ("history_transformer", ("history:h0",), {"num_heads": 2}, 1),
    ("history_cross", ("history:h0",), {"num_heads": 2, "encoder": True}, 1),
]


@pytest.mark.parametrize(
    ("op", "inputs", "knobs", "tokens"), ONE_BLOCK, ids=[f"{o[0]}-{i}" for i, o in enumerate(ONE_BLOCK)]
)
@pytest.mark.parametrize(("rocs", "share"), [(False, None), (True, None), (True, 0.75)])
def test_one_block_architectures(
    op: str, inputs: tuple[Any, ...], knobs: dict[str, Any], tokens: int, rocs: bool, share: float | None,
    spec: FeatureSpec, batch: Batch,
) -> None:
    """Every block, unmasked and masked (the head's hidden layers masked too), at two shares."""
    head = HeadGene((0, "sparse"), (5, 3))
    arch = Architecture((BlockGene(op, inputs, knobs, tokens=tokens),), head, 4, rocs=rocs, rocs_share=share)
    if arch.histories():  # a history block: data with a history (sharing s0's table)
        spec = tiny_spec(history=3)
        batch = tiny_batch(spec, B)
    check(arch, spec, batch)


def test_every_block_op_is_covered() -> None:
    from rankitect.blocks import BLOCKS

    assert {o[0] for o in ONE_BLOCK} == set(BLOCKS)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["nasrec", "engineer"])
def test_200_sampled_architectures(name: str, spec: FeatureSpec, batch: Batch) -> None:
    space, rng = small_space(name), np.random.default_rng(7)
    for _ in range(200):
        check(space.decode(space.sample(rng)), spec, batch)


@pytest.mark.parametrize("name", ["nasrec", "engineer"])
def test_default_menus_a_few_samples(name: str, spec: FeatureSpec, batch: Batch) -> None:
    space, rng = get_space(name), np.random.default_rng(3)
    for _ in range(4):
        check(space.decode(space.sample(rng)), spec, batch)


def test_head_and_projection_formula(spec: FeatureSpec) -> None:
    # efc over 6 sparse + 2 projected dense tokens -> 3 fields; head 3*4 -> 5 -> 1.
    arch = Architecture((BlockGene("efc", ("sparse", "dense"), {"out_fields": 3}, tokens=2),), HeadGene((0,), (5,)), 4)
    projection = 2 * spec.n_dense * (2 * 4)
    efc = 2 * (6 + 2) * 3 * 4
    head = 2 * 12 * 5 + 2 * 5 * 1
    assert cost(arch, spec).flops == projection + efc + head
