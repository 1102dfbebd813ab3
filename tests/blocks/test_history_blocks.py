"""History blocks against references written out here (loops over positions, torch's own
``nn.MultiheadAttention``), their ROCS split against their forward, and their weight cuts."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from rankitect.blocks import build_block
from rankitect.blocks.sequence import History, HistorySplit
from rankitect.blocks.slicing import pick
from tests.blocks.cases import HISTORY, case_id, history_input


def _history(L: int = 5, D: int = 4, B: int = 6, seed: int = 0) -> History:
    x = history_input((L, D), B, torch.Generator().manual_seed(seed))
    return History(x.seq.double(), x.mask, x.target.double())


@pytest.mark.parametrize("mode", ["mean", "sum"])
def test_pool_is_the_masked_mean_or_sum_over_positions(mode: str) -> None:
    x = _history()
    out = build_block("history_pool", (5, 4), {"mode": mode}).double()(x)
    for b in range(6):
        total = torch.zeros(4, dtype=torch.float64)
        count = 0
        for i in range(5):
            if x.mask[b, i]:
                total += x.seq[b, i]
                count += 1
        expected = total / max(count, 1) if mode == "mean" else total
        torch.testing.assert_close(out[b, 0], expected)


def test_target_attention_weighs_each_position_by_the_mlp_of_its_relation_to_the_candidate() -> None:
    x = _history()
    din = build_block("target_attention", (5, 4), {"width": 6, "num_layers": 2}).double()
    out = din(x)
    for b in range(6):
        expected = torch.zeros(4, dtype=torch.float64)
        v = x.target[b]
        for i in range(5):
            if not x.mask[b, i]:
                continue
            e = x.seq[b, i]
            h = torch.cat([e, v, e - v, e * v])
            for layer in din.hidden:
                h = torch.relu(layer.weight @ h + layer.bias)
            w = din.out.weight[0] @ h + din.out.bias[0]  # no softmax
            expected += w * e
        torch.testing.assert_close(out[b, 0], expected)


def _torch_attention(block_attention: nn.Module, heads: int, D: int) -> nn.MultiheadAttention:
    """torch's own multi-head attention holding the block's projections."""
    mha = nn.MultiheadAttention(D, heads, batch_first=True).double()
    with torch.no_grad():
        mha.in_proj_weight.copy_(block_attention.qkv.weight)
        mha.in_proj_bias.copy_(block_attention.qkv.bias)
        mha.out_proj.weight.copy_(block_attention.proj.weight)
        mha.out_proj.bias.copy_(block_attention.proj.bias)
    return mha.eval()


def test_history_transformer_is_torchs_attention_layer_over_history_and_candidate() -> None:
    x = _history()
    bst = build_block("history_transformer", (5, 4), {"num_heads": 2}).double().eval()
    mha = _torch_attention(bst.attention, 2, 4)
    tokens = torch.cat([x.seq, x.target[:, None]], dim=1) + bst.position
    keep = torch.cat([x.mask, torch.ones(6, 1, dtype=torch.bool)], dim=1)
    attended, _ = mha(tokens, tokens, tokens, key_padding_mask=~keep)
    y = bst.attention.norm(tokens + attended)
    z = bst.ffn_norm(y + bst.ffn(y)) * keep[..., None]
    torch.testing.assert_close(bst(x), z)


@pytest.mark.parametrize("encoder", [True, False])
def test_history_cross_is_a_softmax_over_valid_positions_per_head(encoder: bool) -> None:
    x = _history(L=5, D=6)
    dca = build_block("history_cross", (5, 6), {"num_heads": 3, "encoder": encoder}).double().eval()
    h = x.seq + dca.position
    if encoder:
        mha = _torch_attention(dca.encoder, 3, 6)
        valid = x.mask.any(1)
        attended, _ = mha(h[valid], h[valid], h[valid], key_padding_mask=~x.mask[valid])
        h = h.clone()
        h[valid] = dca.encoder.norm(h[valid] + attended)  # rows without a valid key: never read below
    k, v = dca.kv(h).split(6, dim=-1)
    q = dca.query(x.target)
    out = dca(x)
    for b in range(6):
        read = torch.zeros(6, dtype=torch.float64)
        for head in range(3):
            cols = slice(2 * head, 2 * head + 2)
            valid = [i for i in range(5) if x.mask[b, i]]
            if not valid:
                continue
            scores = torch.stack([q[b, cols] @ k[b, i, cols] / math.sqrt(2) for i in valid])
            weights = scores.softmax(0)
            read[cols] = sum(w * v[b, i, cols] for w, i in zip(weights, valid))
        torch.testing.assert_close(out[b, 0], dca.proj.weight @ read + dca.proj.bias)


@pytest.mark.parametrize(("op", "in_shape", "params"), HISTORY, ids=[case_id(*c) for c in HISTORY])
def test_the_split_forward_reads_each_requests_history_once_and_equals_the_forward(op, in_shape, params) -> None:
    L, D = in_shape
    torch.manual_seed(0)
    block = build_block(op, in_shape, params, request_in=L).double().eval()
    per_request = _history(L, D, B=4, seed=3)  # 4 requests, the first with an empty history
    index = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3])
    first = torch.tensor([0, 2, 5, 6])
    target = torch.randn(8, D, dtype=torch.float64)
    split = HistorySplit(per_request.seq, per_request.mask, target, index, first)
    out = block.forward_split(split)
    assert out.req.shape[1] == block.request_out and out.cand.shape[1] == block.out_shape[0] - block.request_out
    torch.testing.assert_close(out.full(), block(split.full()))


def test_a_narrower_target_attention_is_cut_from_the_widest() -> None:
    widest = build_block("target_attention", (5, 4), {"width": 8})
    narrow = build_block("target_attention", (5, 4), {"width": 4})
    params, out_pos = narrow.slice_from(widest, torch.arange(5), pick)
    narrow.load_state_dict(params)
    torch.testing.assert_close(narrow.hidden[1].weight, widest.hidden[1].weight[:2, :4])
    torch.testing.assert_close(narrow.out.weight, widest.out.weight[:, :2])
    assert out_pos.tolist() == [0]
    with pytest.raises(ValueError, match="1 layers cannot be cut from 2"):
        build_block("target_attention", (5, 4), {"width": 4, "num_layers": 1}).slice_from(widest, torch.arange(5))


def test_bad_history_block_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        build_block("history_pool", (5, 4), {"mode": "max"})
    with pytest.raises(ValueError, match="request_in of a history block must be None, 0 or max_len=5"):
        build_block("history_cross", (5, 4), request_in=2)
    with pytest.raises(ValueError, match="not divisible by num_heads=3"):
        build_block("history_transformer", (5, 4), {"num_heads": 3})
