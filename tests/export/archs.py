"""Genotypes the export tests share: every op in one model, raw-input-only models, preset samples."""

from __future__ import annotations

import dataclasses

import numpy as np

from rankitect.space.architecture import Architecture, BlockGene, HeadGene
from rankitect.space.space import get_space

# Every registered op inside whole models: tokens > 1, two-input blocks with one and three inputs,
# field blocks fed by flat outputs, the head reading raw inputs and several blocks.
ALL_OPS = Architecture(
    (
        BlockGene("mlp", ("dense",), {"width": 6, "num_layers": 2}),
        BlockGene("attention", ("sparse", 0), {"num_heads": 1}, tokens=3),
        BlockGene("efc", (1, "sparse"), {"out_fields": 5}),
        BlockGene("dot", (2,)),
        BlockGene("gating", (0, 3, "dense"), {"width": 6}),
        BlockGene("fm", (2, 1)),
        BlockGene("dcn", (4, 5), {"low_rank": 3}),
        BlockGene("wukong", (2,), {"fmb_fields": 2, "lcb_fields": 2, "low_rank": 2, "mlp_width": 4}),
        BlockGene("dhen", (7, 4), {"modules": ["dot", "attention", "linear", "dcn", "fm"], "out_fields": 3},
                  tokens=2),
        BlockGene("sum", (6,), {"width": 4}),
        BlockGene("dhen", (8, "sparse"), {"modules": ["fm", "linear"], "out_fields": 2, "combine": "sum"}),
        BlockGene("buckets", ("dense",), {"dim": 3, "bins": 4}),
    ),
    HeadGene((9, 10, 11, "dense"), (5,)),
    embedding_dim=3,
)
# Every history op, reading the history of tiny_spec(history=...) ("h0", sharing s0's table).
HISTORY_OPS = Architecture(
    (
        BlockGene("history_pool", ("history:h0",), {"mode": "sum"}),
        BlockGene("target_attention", ("history:h0",), {"width": 4}),
        BlockGene("history_transformer", ("history:h0",), {"num_heads": 1}),
        BlockGene("history_cross", ("history:h0",), {"num_heads": 3, "encoder": True}),
        BlockGene("attention", ("sparse", 0, 1, "dense"), {"num_heads": 1}),
    ),
    HeadGene((4, 2, 3, "dense"), (5,)),
    embedding_dim=3,
)
DENSE_ONLY = Architecture((BlockGene("dcn", ("dense",), {"num_layers": 1}),), HeadGene((0, "dense"), ()), 4)
SPARSE_ONLY = Architecture((BlockGene("fm", ("sparse",)),), HeadGene((0, "sparse"), (3,)), 4)
SMALL_NASREC = {"widths": (8, 16), "tokens": (2, 4), "merge_tokens": 2, "embedding_dim": 4}
SMALL_ENGINEER = {
    "embedding_dim": 4, "widths": (8, 16), "layer_widths": (8,), "fields": (2, 4), "wukong_ranks": (2, 3),
    "cross_ranks": (0, 4), "heads": (1, 2),
}


def both_masks(arch: Architecture) -> list[Architecture]:
    return [arch, dataclasses.replace(arch, rocs=True)]


def every_mask(arch: Architecture) -> list[Architecture]:
    """Unmasked, masked with the proportional share and masked with ``rocs_share=0.75``."""
    return [*both_masks(arch), dataclasses.replace(arch, rocs=True, rocs_share=0.75)]


def sampled(name: str, options: dict, count: int, seed: int) -> list[Architecture]:
    space, rng = get_space(name, **options), np.random.default_rng(seed)
    return [space.decode(space.sample(rng)) for _ in range(count)]
