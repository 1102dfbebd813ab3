"""Every masked block, computed on :class:`~rankitect.serve.split.Split` tensors.

Each function takes a built block (its own weights, no copies) and split inputs, and returns the
block's output as a split at ``block.request_out``: the request part once per request, the
candidate part per candidate, with the request-side contributions to candidate outputs computed
per request and gathered (in-kernel broadcast). A block without an entry in :data:`SPLIT_FORWARDS`
runs through :func:`fallback`: correct, but it saves nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from rankitect.blocks.attention import Attention
from rankitect.blocks.base import Block
from rankitect.blocks.common import FieldLinear, MaskedLinear, SplitLayerNorm
from rankitect.blocks.dcn import DCN, CrossMap
from rankitect.blocks.dhen import DHEN, Branch
from rankitect.blocks.dot import Dot
from rankitect.blocks.efc import EFC
from rankitect.blocks.fm import FM, fm_pairs
from rankitect.blocks.gating import Gating
from rankitect.blocks.mlp import MLP
from rankitect.blocks.sum_block import Sum
from rankitect.blocks.wukong import FactorizationMachineBlock, Wukong
from rankitect.serve.split import Split, add, cat, cut, field_linear, linear, split_layer_norm

SplitForward = Callable[..., Split]
SPLIT_FORWARDS: dict[type[Block], SplitForward] = {}


def split_forward_of(cls: type[Block]) -> Callable[[SplitForward], SplitForward]:
    """Register the split forward of block class ``cls``; a second one is an error."""

    def wrap(fn: SplitForward) -> SplitForward:
        if cls in SPLIT_FORWARDS:
            raise ValueError(f"a split forward of {cls.__qualname__} is already registered")
        SPLIT_FORWARDS[cls] = fn
        return fn

    return wrap


def run_block(block: Block, *xs: Split) -> Split:
    """``block`` on split inputs: its registered split forward, else :func:`fallback`."""
    fn = SPLIT_FORWARDS.get(type(block))
    return fn(block, *xs) if fn is not None else fallback(block, *xs)


def fallback(block: Block, *xs: Split) -> Split:
    """Run ``block`` per candidate on the broadcast inputs, then cut its output (no FLOPs saved)."""
    out = block(*[x.full() for x in xs])
    return cut(out, block.request_out, xs[0].index, xs[0].first)


def sequential(layers: nn.Sequential, x: Split) -> Split:
    """Masked linears, split LayerNorms and per-unit activations, in order."""
    for layer in layers:
        if isinstance(layer, MaskedLinear):
            x = linear(layer, x)
        elif isinstance(layer, SplitLayerNorm):
            x = split_layer_norm(layer, x)
        elif isinstance(layer, (nn.ReLU, nn.GELU, nn.SiLU, nn.Identity)):
            x = x.map(layer)
        else:
            raise TypeError(f"no split form for layer {type(layer).__name__}")
    return x


@split_forward_of(MLP)
def _mlp(block: MLP, x: Split) -> Split:
    return sequential(block.layers, x)


@split_forward_of(EFC)
def _efc(block: EFC, x: Split) -> Split:
    return field_linear(block.linear, x)


def _cross_map(layer: CrossMap, x: Split) -> Split:
    h = linear(layer.down, x) if isinstance(layer.down, MaskedLinear) else x
    return linear(layer.up, h)


@split_forward_of(DCN)
def _dcn(block: DCN, x: Split) -> Split:
    x0 = x
    for layer in block.layers:
        y = _cross_map(layer, x)
        x = x.like(x0.req * y.req + x.req, x0.cand * y.cand + x.cand)
    return x


@split_forward_of(Dot)
def _dot(block: Dot, x: Split) -> Split:
    R, N = x.request_width, block.in_fields
    C, u, c = N - R, x.req, x.cand
    gram_u = torch.bmm(u, u.transpose(1, 2))  # (Q, R, D) @ (Q, D, R) -> (Q, R, R)
    # Candidate rows of the Gram matrix: against the request fields and against each other.
    cross = torch.bmm(c, u.index_select(0, x.index).transpose(1, 2))  # (B, C, D) @ (B, D, R) -> (B, C, R)
    own = torch.bmm(c, c.transpose(1, 2))  # (B, C, D) @ (B, D, C) -> (B, C, C)
    # The block's pairs (i, j), i < j, in its output order (request x request pairs first).
    i, j = block.index // N, block.index % N
    n_req = R * (R - 1) // 2
    req = gram_u.reshape(u.shape[0], R * R).index_select(1, i[:n_req] * R + j[:n_req])  # (Q, R(R-1)/2)
    i, j = i[n_req:], j[n_req:]  # j >= R: pairs with a candidate field
    pos = torch.where(i < R, (j - R) * R + i, C * R + (i - R) * C + (j - R))  # in [cross | own]
    both = torch.cat([cross.reshape(c.shape[0], C * R), own.reshape(c.shape[0], C * C)], dim=1)  # (B, C*R + C*C)
    return x.like(req, both.index_select(1, pos))


@split_forward_of(FM)
def _fm(block: FM, x: Split) -> Split:
    u, c = x.req, x.cand
    total = u.sum(dim=1).index_select(0, x.index) + c.sum(dim=1)  # (B, D): sum over all fields
    squares = (u * u).sum(dim=1).index_select(0, x.index) + (c * c).sum(dim=1)
    full = 0.5 * (total * total - squares)
    req = fm_pairs(u) if block.split else u.new_zeros(u.shape[0], 0)
    return x.like(req, full)


def _heads(t: torch.Tensor, H: int) -> torch.Tensor:
    B, N, three_d = t.shape
    # (B, N, 3D) -> (B, N, 3, H, Dh) -> 3 x (B, H, N, Dh)
    return t.reshape(B, N, 3, H, three_d // (3 * H)).permute(2, 0, 3, 1, 4)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    # The scale on the queries (n x Dh per head) costs less than on the scores (n x m).
    scores = torch.matmul(q / scale, k.transpose(-1, -2))  # (B, H, n, Dh) @ (B, H, Dh, m) -> (B, H, n, m)
    out = torch.matmul(scores.softmax(dim=-1), v)  # (B, H, n, m) @ (B, H, m, Dh) -> (B, H, n, Dh)
    B, H, n, Dh = out.shape
    return out.transpose(1, 2).reshape(B, n, H * Dh)  # (B, H, n, Dh) -> (B, n, H, Dh) -> (B, n, D)


@split_forward_of(Attention)
def _attention(block: Attention, x: Split) -> Split:
    """Request queries see request keys only; candidate queries see the request's K/V, computed once."""
    H, D = block.num_heads, block.dim
    scale = math.sqrt(D // H)
    q_u, k_u, v_u = _heads(block.qkv(x.req), H)  # 3 x (Q, H, R, Dh)
    q_c, k_c, v_c = _heads(block.qkv(x.cand), H)  # 3 x (B, H, C, Dh)
    keys = torch.cat([k_u.index_select(0, x.index), k_c], dim=2)  # (B, H, N, Dh)
    values = torch.cat([v_u.index_select(0, x.index), v_c], dim=2)
    y = x.like(_attend(q_u, k_u, v_u, scale), _attend(q_c, keys, values, scale))
    y = add(x, y.map(block.proj)).map(block.norm)
    if block.ffn is not None and block.ffn_norm is not None:
        y = add(y, y.map(block.ffn)).map(block.ffn_norm)
    return y


@split_forward_of(Gating)
def _gating(block: Gating, left: Split, right: Split) -> Split:
    gate = linear(block.gate, left)
    return linear(block.proj, right.like(right.req * torch.sigmoid(gate.req), right.cand * torch.sigmoid(gate.cand)))


@split_forward_of(Sum)
def _sum(block: Sum, left: Split, right: Split) -> Split:
    return add(linear(block.left, left), linear(block.right, right)).map(torch.relu)


def _fmb(fmb: FactorizationMachineBlock, x: Split) -> Split:
    """Wukong's FMB: ``Z = X (Xᵀ Y)`` with the request entries ``Z[:R, :kr]`` once per request."""
    R, k, D = x.request_width, fmb.low_rank, fmb.dim
    kr = fmb.rank_request
    y = fmb.y if fmb.y_mask is None else fmb.y * fmb.y_mask  # (N, k); y[R:, :kr] == 0
    u, c = x.req, x.cand
    xty_u = torch.matmul(u.transpose(1, 2), y[:R])  # (Q, D, R) @ (R, k) -> (Q, D, k)
    # Xᵀ Y of the candidate columns: request rows' share (per request) + candidate rows' share
    xty_c = torch.matmul(c.transpose(1, 2), y[R:, kr:]) + xty_u[..., kr:].index_select(0, x.index)  # (B, D, k-kr)
    z_req = torch.matmul(u, xty_u[..., :kr])  # (Q, R, D) @ (Q, D, kr) -> (Q, R, kr)
    z_uc = torch.matmul(u.index_select(0, x.index), xty_c)  # (B, R, D) @ (B, D, k-kr) -> (B, R, k-kr)
    xty_all = torch.cat([xty_u[..., :kr].index_select(0, x.index), xty_c], dim=2)  # (B, D, k)
    z_c = torch.matmul(c, xty_all)  # (B, C, D) @ (B, D, k) -> (B, C, k)
    # Row-major over (field, column) without the request entries: the block's flat order.
    h = x.like(z_req.flatten(1), torch.cat([z_uc.flatten(1), z_c.flatten(1)], dim=1))
    h = split_layer_norm(fmb.norm, h)
    if fmb.mlp is not None:
        h = sequential(fmb.mlp.layers, h)
    return linear(fmb.out, h).fields(D)  # (., r*D) -> (., r, D)


@split_forward_of(Wukong)
def _wukong(block: Wukong, x: Split) -> Split:
    fmb, lcb = _fmb(block.fmb, x), field_linear(block.lcb, x)
    out = cat([fmb, lcb])  # request fields of both parts first, as the block orders them
    shortcut = x if block.residual is None else field_linear(block.residual, x)
    return add(out, shortcut).map(block.norm)


def _branch(branch: Branch, x: Split) -> Split:
    h = x.flat() if branch.flatten else x
    if branch.body is not None:
        h = run_block(branch.body, h)
    if isinstance(branch.head, FieldLinear):
        h = field_linear(branch.head, h)
    elif branch.head is not None:
        h = linear(branch.head, h)
    return h if h.req.dim() == 3 else h.fields(branch.dim)


@split_forward_of(DHEN)
def _dhen(block: DHEN, x: Split) -> Split:
    outs = [_branch(b, x) for b in block.branches]  # M x field splits of out_fields
    if block.mix is not None:
        y = field_linear(block.mix, cat(outs))  # request fields of every module first
    else:
        y = outs[0]
        for o in outs[1:]:
            y = add(y, o)
    shortcut = x if block.shortcut is None else field_linear(block.shortcut, x)
    return add(y, shortcut).map(block.norm)


__all__ = ["SPLIT_FORWARDS", "fallback", "run_block", "sequential", "split_forward_of"]
