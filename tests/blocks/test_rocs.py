"""ROCS Generalized Layer Masking: request-side outputs never see candidate-side inputs."""

from __future__ import annotations

import pytest
import torch

from rankitect.blocks import BLOCKS, build_block
from rankitect.blocks.base import takes_share
from rankitect.blocks.common import MaskedLinear, SplitLayerNorm, check_share, request_share
from rankitect.space.builder import Head
from tests.blocks.cases import SETTINGS, case_id, make_inputs, seeded_block

MIXING = [(op, shape, params) for op, shape, params in SETTINGS if BLOCKS[op].mixes_fields]


def request_counts(op: str, in_shape: tuple[int, ...]) -> list[int | tuple[int, int]]:
    """Edge and middle request counts: 1 (no request pair for dot/fm), 2, and all but one."""
    if BLOCKS[op].num_inputs == 2:
        left, right = in_shape
        return [(1, 1), (2, right - 1), (left - 1, 2)]
    size = in_shape[0]
    return sorted({1, 2, size - 1})


def perturb_candidates(inputs: list[torch.Tensor], request_in: int | tuple[int, int]) -> list[torch.Tensor]:
    """Replace every candidate-side field (or unit) of every input by fresh noise."""
    counts = request_in if isinstance(request_in, tuple) else (request_in,)
    out = []
    for x, r in zip(inputs, counts):
        y = x.clone()
        y[:, r:] = torch.randn_like(y[:, r:]) * 3.0  # fields (B, N-R, D) or units (B, W-R)
        out.append(y)
    return out


CASES = [
    pytest.param(op, shape, params, r, share, id=f"{case_id(op, shape, params)}-R{r}-share{share}")
    for op, shape, params in MIXING
    for r in request_counts(op, shape)
    for share in (None, 0.75)
]


@pytest.mark.parametrize(("op", "in_shape", "params", "request_in", "share"), CASES)
def test_request_outputs_ignore_candidates(
    op: str, in_shape: tuple[int, ...], params: dict, request_in, share: float | None
) -> None:
    torch.manual_seed(0)
    masked = build_block(op, in_shape, params, request_in=request_in, rocs_share=share)
    ro = masked.request_out
    no_pair = op in ("dot", "fm") and request_in == 1  # a single request field has no pair
    assert ro == 0 if no_pair else ro > 0
    if no_pair:
        return
    assert ro < masked.out_shape[0] or op == "fm"  # candidates keep room (FM widens instead)
    torch.manual_seed(5)
    inputs = make_inputs(masked, in_shape, 4, torch.Generator().manual_seed(2))
    moved = perturb_candidates(inputs, request_in)
    assert torch.equal(masked(*inputs)[:, :ro], masked(*moved)[:, :ro])
    assert not torch.equal(masked(*inputs)[:, ro:], masked(*moved)[:, ro:])

    # The same block unmasked (same seed, so the same weights) does let candidates through; except
    # dot with R = 2, whose row-major pair order already starts with the one request pair (0, 1).
    if op == "dot" and request_in == 2:
        return
    plain = seeded_block(op, in_shape, params, None)
    assert not torch.equal(plain(*inputs)[:, :ro], plain(*moved)[:, :ro])


def test_masked_and_plain_share_weights() -> None:
    """Masks are non-persistent buffers, so masked and plain blocks load each other's weights."""
    masked = seeded_block("wukong", (5, 4), {"fmb_fields": 2, "lcb_fields": 2}, 2)
    plain = build_block("wukong", (5, 4), {"fmb_fields": 2, "lcb_fields": 2})
    plain.load_state_dict(masked.state_dict())
    assert set(masked.state_dict()) == set(plain.state_dict())


def test_masked_linear_is_block_lower_triangular() -> None:
    lin = MaskedLinear(5, 4, request_in=2, request_out=1)
    x = torch.randn(3, 5)
    expected = x[:, :2] @ lin.weight[:1, :2].T + lin.bias[:1]  # request row from request inputs only
    torch.testing.assert_close(lin(x)[:, :1], expected)
    torch.testing.assert_close(lin(x)[:, 1:], x @ lin.weight[1:].T + lin.bias[1:])


def standardize(v: torch.Tensor) -> torch.Tensor:
    """Textbook LayerNorm without affine; a single unit is left as it is."""
    if v.shape[-1] == 1:
        return v
    mean = v.mean(dim=-1, keepdim=True)
    var = ((v - mean) ** 2).mean(dim=-1, keepdim=True)  # biased variance, as LayerNorm
    return (v - mean) / torch.sqrt(var + 1e-5)


@pytest.mark.parametrize("request_in", [1, 2, 5])
def test_split_layer_norm_uses_separate_statistics(request_in: int) -> None:
    norm = SplitLayerNorm(6, request_in=request_in).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-1.0, 1.0)
    x = torch.randn(4, 6, dtype=torch.float64)
    r = request_in
    expected = torch.cat([standardize(x[:, :r]), standardize(x[:, r:])], dim=1) * norm.weight + norm.bias
    torch.testing.assert_close(norm(x), expected)


@pytest.mark.parametrize("size_in", [2, 3, 7, 10])
@pytest.mark.parametrize("size_out", [1, 2, 5, 16])
def test_request_share_bounds(size_in: int, size_out: int) -> None:
    for r in range(1, size_in):
        share = request_share(r, size_in, size_out)
        assert (share == 0) if size_out == 1 else (1 <= share <= size_out - 1)
        # Nearest to the proportional share unless clamped to keep one unit on each side.
        assert abs(share - r * size_out / size_in) <= 0.5 or share in (1, size_out - 1)
    assert request_share(size_in, size_in, size_out) == size_out
    assert request_share(0, size_in, size_out) == request_share(None, size_in, size_out) == 0



def shared_units(layers: torch.nn.Module) -> list[tuple[int, int]]:
    """``(request_out, out_features)`` of every masked linear map inside a module."""
    return [(m.request_out, m.out_features) for m in layers.modules() if isinstance(m, MaskedLinear)]


@pytest.mark.parametrize(("op", "in_shape", "params"), [pytest.param(*s, id=case_id(*s)) for s in MIXING])
def test_a_larger_share_gives_more_request_units(op: str, in_shape: tuple[int, ...], params: dict) -> None:
    """Blocks with a free share give more units to the request side at 0.9 than at 0.25; blocks
    whose request outputs follow from their structure do not take the share at all."""
    request_in = (2, 2) if BLOCKS[op].num_inputs == 2 else 2
    low = build_block(op, in_shape, params, request_in=request_in, rocs_share=0.25)
    high = build_block(op, in_shape, params, request_in=request_in, rocs_share=0.9)
    full_rank = op == "dcn" and params.get("low_rank", 0) == 0  # cross layers map R units to R
    # DHEN with an identity shortcut keeps R fields; without a low-rank DCN module no map is free.
    fixed_dhen = op == "dhen" and in_shape[0] == params["out_fields"] and "dcn" not in params["modules"]
    if not takes_share(op) or full_rank or fixed_dhen:
        assert shared_units(low) == shared_units(high)
        return
    assert sum(r for r, _ in shared_units(low)) < sum(r for r, _ in shared_units(high))


@pytest.mark.parametrize("share", [0.25, 0.5, 0.9])
@pytest.mark.parametrize(("op", "in_shape", "params"), [("mlp", (6,), {"width": 8, "num_layers": 2}),
                                                        ("efc", (5, 3), {"out_fields": 4}),
                                                        ("sum", (5, 6), {"width": 7})])
def test_share_of_single_maps(op: str, in_shape: tuple[int, ...], params: dict, share: float) -> None:
    """Each map reading both sides gives round(share * outputs) to the request side (1 .. out - 1)."""
    request_in = (1, 4) if op == "sum" else 2
    block = build_block(op, in_shape, params, request_in=request_in, rocs_share=share)
    for m in block.modules():
        if isinstance(m, MaskedLinear):
            out = m.out_features
            assert m.request_out == min(max(round(share * out), 1), out - 1), (op, m)


@pytest.mark.parametrize("share", [None, 0.75])
@pytest.mark.parametrize("widths", [[5], [6, 4, 3]])
def test_masked_head_hidden_request_units_ignore_candidates(widths: list[int], share: float | None) -> None:
    torch.manual_seed(0)
    head = Head(9, widths, request_in=3, rocs_share=share)
    hidden = head.mlp[:-2]  # every hidden layer up to the last ReLU (which may zero a candidate unit)
    units = shared_units(hidden)
    assert all(0 < r < n for r, n in units) and head.request_out == units[-1][0]
    if share is not None:
        assert units[0][0] == min(max(round(share * widths[0]), 1), widths[0] - 1)
    x = torch.randn(4, 9)
    moved = x.clone()
    moved[:, 3:] = torch.randn(4, 6) * 3.0
    r = head.request_out
    assert torch.equal(hidden(x)[:, :r], hidden(moved)[:, :r])
    assert not torch.equal(hidden(x)[:, r:], hidden(moved)[:, r:])
    assert type(head.mlp[-1]) is torch.nn.Linear and head.mlp[-1].in_features == widths[-1]  # reads every unit


def test_unmasked_head_is_plain_linear_layers() -> None:
    head = Head(7, [5, 3])
    assert [type(m) for m in head.mlp] == [torch.nn.Linear, torch.nn.ReLU] * 2 + [torch.nn.Linear]
    assert list(head.state_dict()) == list(Head(7, [5, 3], request_in=2, rocs_share=0.5).state_dict())


@pytest.mark.parametrize("share", [0.1, 0.5, 0.75, 0.9])
@pytest.mark.parametrize("size_out", [1, 2, 5, 16])
def test_request_share_with_a_share(share: float, size_out: int) -> None:
    for size_in in (2, 7):
        for r in range(1, size_in):
            got = request_share(r, size_in, size_out, share)
            if size_out == 1:
                assert got == 0
            else:  # the share of the outputs, whatever the input share, one unit kept on each side
                assert got == min(max(round(share * size_out), 1), size_out - 1)
        assert request_share(size_in, size_in, size_out, share) == size_out
        assert request_share(0, size_in, size_out, share) == request_share(None, size_in, size_out, share) == 0


@pytest.mark.parametrize("bad", [0.0, 1.0, 1.5, -0.2, float("nan"), float("inf"), True, 1, "0.5"])
def test_bad_shares_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="rocs_share"):
        check_share(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rocs_share"):
        build_block("mlp", (6,), {"width": 4}, request_in=2, rocs_share=bad)  # type: ignore[arg-type]
