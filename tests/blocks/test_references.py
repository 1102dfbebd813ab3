"""Each formula against a naive reference written out here with explicit loops (float64)."""

from __future__ import annotations

import math

import pytest
import torch

from rankitect.blocks import build_block


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def layer_norm(v: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    mean = v.mean(dim=-1, keepdim=True)
    var = ((v - mean) ** 2).mean(dim=-1, keepdim=True)
    return (v - mean) / torch.sqrt(var + eps) * weight + bias


def fm_loop(x: torch.Tensor) -> torch.Tensor:
    B, N, D = x.shape
    out = torch.zeros(B, D, dtype=x.dtype)
    for i in range(N):
        for j in range(i + 1, N):
            out += x[:, i] * x[:, j]
    return out


def test_fm_matches_pairwise_loop() -> None:
    x = randn(3, 5, 4)
    torch.testing.assert_close(build_block("fm", (5, 4)).double()(x), fm_loop(x))
    masked = build_block("fm", (5, 4), request_in=3).double()
    torch.testing.assert_close(masked(x), torch.cat([fm_loop(x[:, :3]), fm_loop(x)], dim=1))


def test_dot_matches_pairwise_loop() -> None:
    x = randn(2, 4, 3)
    pairs = [(i, j) for i in range(4) for j in range(i + 1, 4)]
    expected = torch.stack([(x[:, i] * x[:, j]).sum(-1) for i, j in pairs], dim=1)
    torch.testing.assert_close(build_block("dot", (4, 3)).double()(x), expected)
    request_first = [p for p in pairs if p[1] < 3] + [p for p in pairs if p[1] >= 3]
    expected = torch.stack([(x[:, i] * x[:, j]).sum(-1) for i, j in request_first], dim=1)
    torch.testing.assert_close(build_block("dot", (4, 3), request_in=3).double()(x), expected)


def test_efc_matches_loop() -> None:
    block = build_block("efc", (4, 3), {"out_fields": 2}).double()
    w, b = block.linear.weight, block.linear.bias
    x = randn(2, 4, 3)
    expected = torch.zeros(2, 2, 3, dtype=torch.float64)
    for o in range(2):
        expected[:, o] = b[o]
        for n in range(4):
            expected[:, o] += w[o, n] * x[:, n]
    torch.testing.assert_close(block(x), expected)


@pytest.mark.parametrize("low_rank", [0, 2])
@pytest.mark.parametrize("request_in", [None, 2])
def test_dcn_matches_recurrence(low_rank: int, request_in: int | None) -> None:
    block = build_block("dcn", (5,), {"num_layers": 3, "low_rank": low_rank}, request_in=request_in).double()
    x0 = randn(4, 5)
    x = x0
    for layer in block.layers:
        w = layer.up.weight if low_rank == 0 else layer.up.weight @ layer.down.weight  # U Vᵀ: (5, r) @ (r, 5)
        if request_in is not None:
            w = w.clone()
            if low_rank == 0:
                w[:request_in, request_in:] = 0.0
            else:  # request rank units see request inputs only, request outputs those rank units only
                u, v = layer.up.weight.clone(), layer.down.weight.clone()
                rr = 1  # the request share of rank 2 for 2 of 5 request units
                v[:rr, request_in:] = 0.0
                u[:request_in, rr:] = 0.0
                w = u @ v
        x = x0 * (x @ w.T + layer.up.bias) + x
    torch.testing.assert_close(block(x0), x)


def attention_reference(block, x: torch.Tensor, request_in: int | None) -> torch.Tensor:
    B, N, D = x.shape
    H, dk = block.num_heads, D // block.num_heads
    wq, wk, wv = block.qkv.weight.split(D)
    bq, bk, bv = block.qkv.bias.split(D)
    q, k, v = x @ wq.T + bq, x @ wk.T + bk, x @ wv.T + bv
    heads = torch.zeros(B, N, D, dtype=x.dtype)
    for h in range(H):
        cols = slice(h * dk, (h + 1) * dk)
        for i in range(N):
            keys = range(request_in) if request_in and i < request_in else range(N)
            scores = torch.stack([(q[:, i, cols] * k[:, j, cols]).sum(-1) / math.sqrt(dk) for j in keys], 1)
            weights = torch.exp(scores) / torch.exp(scores).sum(dim=1, keepdim=True)
            heads[:, i, cols] = sum(weights[:, n : n + 1] * v[:, j, cols] for n, j in enumerate(keys))
    y = layer_norm(x + heads @ block.proj.weight.T + block.proj.bias, block.norm.weight, block.norm.bias)
    first, _, second = block.ffn
    hidden = torch.relu(y @ first.weight.T + first.bias)
    return layer_norm(y + hidden @ second.weight.T + second.bias, block.ffn_norm.weight, block.ffn_norm.bias)


@pytest.mark.parametrize("request_in", [None, 2])
def test_attention_matches_per_head_softmax(request_in: int | None) -> None:
    block = build_block("attention", (4, 6), {"num_heads": 3}, request_in=request_in).double()
    x = randn(2, 4, 6)
    torch.testing.assert_close(block(x), attention_reference(block, x, request_in))


def test_wukong_matches_formula() -> None:
    params = {"fmb_fields": 2, "lcb_fields": 2, "low_rank": 3, "mlp_width": 5, "mlp_layers": 1}
    block = build_block("wukong", (3, 4), params).double()
    x = randn(2, 3, 4)
    fmb = block.fmb
    # FMB: X (Xᵀ Y) -> flatten -> LN -> MLP (Linear, ReLU) -> Linear -> (2, 4)
    z = torch.stack([x[b] @ (x[b].T @ fmb.y) for b in range(2)])  # (3, 4) @ ((4, 3) @ (3, 3))
    h = layer_norm(z.reshape(2, 9), fmb.norm.weight, fmb.norm.bias)
    hidden = fmb.mlp.layers[0]
    h = torch.relu(h @ hidden.weight.T + hidden.bias)
    fmb_out = (h @ fmb.out.weight.T + fmb.out.bias).reshape(2, 2, 4)
    torch.testing.assert_close(fmb(x), fmb_out)
    # LCB: each output field a combination of the input fields; residual projects 3 -> 4 fields.
    lcb = torch.einsum("on,bnd->bod", block.lcb.weight, x)
    residual = torch.einsum("on,bnd->bod", block.residual.weight, x)
    expected = layer_norm(torch.cat([fmb_out, lcb], dim=1) + residual, block.norm.weight, block.norm.bias)
    torch.testing.assert_close(block(x), expected)


def test_mlp_gating_sum_match_formulas() -> None:
    left, right = randn(3, 4, seed=1), randn(3, 5, seed=2)
    mlp = build_block("mlp", (4,), {"width": 3, "activation": "silu"}).double()
    lin, norm = mlp.layers[0], mlp.layers[1]
    pre = layer_norm(left @ lin.weight.T + lin.bias, norm.weight, norm.bias)
    torch.testing.assert_close(mlp(left), pre * torch.sigmoid(pre))

    gating = build_block("gating", (4, 5), {"width": 2}).double()
    gate = torch.sigmoid(left @ gating.gate.weight.T + gating.gate.bias)
    torch.testing.assert_close(gating(left, right), (right * gate) @ gating.proj.weight.T + gating.proj.bias)

    total = build_block("sum", (4, 5), {"width": 2}).double()
    expected = torch.relu(left @ total.left.weight.T + total.left.bias + right @ total.right.weight.T)
    torch.testing.assert_close(total(left, right), expected)
