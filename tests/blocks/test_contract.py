"""One contract test over the whole registry: shape, gradients, batch size 1, no NaN, FLOPs."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from rankitect.blocks import BLOCKS
from rankitect.blocks.base import SEQUENCE
from rankitect.blocks.sequence import History
from tests.blocks.cases import SETTINGS, case_id, make_inputs, request_for, seeded_block

CASES = [
    pytest.param(op, shape, params, masked, id=f"{case_id(op, shape, params)}-{'masked' if masked else 'plain'}")
    for op, shape, params in SETTINGS
    for masked in (False, True)
]


def test_settings_cover_the_registry() -> None:
    assert {op for op, _, _ in SETTINGS} == set(BLOCKS)


@pytest.mark.parametrize(("op", "in_shape", "params", "masked"), CASES)
def test_block_contract(op: str, in_shape: tuple[int, ...], params: dict, masked: bool) -> None:
    request_in = request_for(op, in_shape) if masked else None
    block = seeded_block(op, in_shape, params, request_in)
    gen = torch.Generator().manual_seed(1)
    if block.in_kind == SEQUENCE:  # request side: what reads the history alone (pooling); the rest reads the candidate
        assert block.request_out == (block.out_shape[0] if masked and not block.uses_target else 0)
    else:
        assert block.request_out == 0 if not masked else 0 < block.request_out <= block.out_shape[0]
    for batch in (1, 3):
        inputs = make_inputs(block, in_shape, batch, gen)
        with FlopCounterMode(display=False) as counter:
            out = block(*inputs)
        assert out.shape == (batch, *block.out_shape)
        assert torch.isfinite(out).all()
        assert counter.get_total_flops() == block.flops() * batch

    inputs = [_with_grad(x) for x in make_inputs(block, in_shape, 3, gen)]
    out = block(*inputs)
    (out * torch.randn(out.shape, generator=gen)).sum().backward()
    if block.in_kind == SEQUENCE:  # the history (and the candidate, where read) get gradients; none is NaN
        inputs = [inputs[0].seq] + ([inputs[0].target] if block.uses_target else [])
        assert all(torch.isfinite(x.grad).all() for x in inputs)
    for x in inputs:  # gradients reach every input, also through parameter-free blocks
        if block.input_gradients:
            assert x.grad is not None and x.grad.abs().sum() > 0
        else:  # piecewise constant in the input: no gradient, by construction
            assert x.grad is None or not x.grad.any()
    for name, param in block.named_parameters():
        assert param.grad is not None, name
        assert param.grad.abs().sum() > 0, name
        assert torch.isfinite(param.grad).all(), name


def _with_grad(x: torch.Tensor | History) -> torch.Tensor | History:
    if isinstance(x, History):
        return History(x.seq.requires_grad_(), x.mask, x.target.requires_grad_())
    return x.requires_grad_()
