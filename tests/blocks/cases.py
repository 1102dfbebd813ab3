"""Block settings shared by the contract and ROCS tests: tiny shapes, every registered op."""

from __future__ import annotations

from typing import Any

import torch

from rankitect.blocks import BLOCKS, FIELD, Block, build_block
from rankitect.blocks.base import SEQUENCE
from rankitect.blocks.sequence import History

# (op, in_shape, params); every op of the registry appears at least once (checked in a test).
SETTINGS: list[tuple[str, tuple[int, ...], dict[str, Any]]] = [
    ("mlp", (6,), {"width": 5}),
    ("mlp", (6,), {"width": 4, "num_layers": 2, "activation": "gelu", "norm": "none"}),
    ("efc", (5, 3), {"out_fields": 4}),
    ("dot", (5, 3), {}),
    ("fm", (5, 3), {}),
    ("dcn", (6,), {"num_layers": 2}),
    ("dcn", (6,), {"num_layers": 1, "low_rank": 3}),
    ("attention", (5, 4), {"num_heads": 2}),
    ("attention", (4, 6), {"num_heads": 3, "ffn": False}),
    ("wukong", (5, 4), {"fmb_fields": 2, "lcb_fields": 3, "low_rank": 3, "mlp_width": 6, "mlp_layers": 2}),
    ("wukong", (5, 4), {"fmb_fields": 3, "lcb_fields": 3, "low_rank": 2, "mlp_width": 4, "mlp_layers": 0}),
    ("dhen", (5, 4), {"modules": ["dot", "attention", "linear", "dcn", "fm"], "out_fields": 3}),
    ("dhen", (4, 3), {"modules": ("fm", "linear", "attention"), "out_fields": 4, "combine": "sum"}),
    ("gating", (5, 6), {"width": 4}),
    ("sum", (5, 6), {"width": 4}),
    ("buckets", (5,), {"dim": 3, "bins": 4}),
    # history blocks: input shape (max_len, dim)
    ("history_pool", (5, 4), {}),
    ("history_pool", (3, 2), {"mode": "sum"}),
    ("target_attention", (5, 4), {"width": 6}),
    ("target_attention", (4, 3), {"width": 4, "num_layers": 1, "activation": "gelu"}),
    ("history_transformer", (5, 4), {"num_heads": 2}),
    ("history_cross", (5, 4), {"num_heads": 2}),
    ("history_cross", (4, 6), {"num_heads": 3, "encoder": False}),
]
HISTORY = [(op, shape, params) for op, shape, params in SETTINGS if BLOCKS[op].in_kind == SEQUENCE]


def request_for(op: str, in_shape: tuple[int, ...], fraction: float = 0.4) -> int | tuple[int, int]:
    """A request-side count of at least 2 (so dot and FM have a request pair) and below the size; a
    history block's history is request side as a whole (``max_len``)."""
    if BLOCKS[op].in_kind == SEQUENCE:
        return in_shape[0]
    counts = [min(max(2, round(fraction * n)), n - 1) for n in in_shape[: BLOCKS[op].num_inputs]]
    return (counts[0], counts[1]) if BLOCKS[op].num_inputs == 2 else counts[0]


def case_id(op: str, in_shape: tuple[int, ...], params: dict[str, Any]) -> str:
    return f"{op}-{'x'.join(map(str, in_shape))}-" + "-".join(f"{k}={v}" for k, v in params.items())


def history_input(in_shape: tuple[int, ...], batch: int, gen: torch.Generator) -> History:
    """A random :class:`History`: right-aligned masks of every length, the first row empty."""
    L, D = in_shape
    lengths = torch.randint(0, L + 1, (batch,), generator=gen)
    lengths[0] = 0  # an empty history in every batch
    if batch > 2:
        lengths[1] = L
    mask = torch.arange(L) >= (L - lengths)[:, None]  # (B, L)
    return History(torch.randn(batch, L, D, generator=gen), mask, torch.randn(batch, D, generator=gen))


def make_inputs(block: Block, in_shape: tuple[int, ...], batch: int, gen: torch.Generator) -> list[torch.Tensor]:
    """Random inputs for ``block``: one field ``(B, N, D)`` or flat ``(B, W)`` tensor per input, or
    one :class:`History` for a history block."""
    if block.in_kind == SEQUENCE:
        return [history_input(in_shape, batch, gen)]
    if block.num_inputs == 2:
        return [torch.randn(batch, n, generator=gen) for n in in_shape]
    if block.in_kind == FIELD:
        return [torch.randn(batch, *in_shape, generator=gen)]
    return [torch.randn(batch, in_shape[0], generator=gen)]


def seeded_block(
    op: str, in_shape: tuple[int, ...], params: dict[str, Any], request_in: int | tuple[int, int] | None, seed: int = 0
) -> Block:
    torch.manual_seed(seed)  # the blocks' own init draws from torch's default generator
    return build_block(op, in_shape, params, request_in=request_in)
