"""Every standalone twin against its rankitect original: same state dict, same outputs, masked or not."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

from rankitect.blocks import BLOCKS, build_block
from rankitect.blocks.base import block_params, takes_share
from rankitect.blocks.common import ACTIVATIONS, NORMS
from rankitect.blocks.dhen import COMBINES, MODULES
from rankitect.export.plan import DHEN_COMBINES, DHEN_MODULES, OP_CLASSES, PARAM_SCHEMA
from rankitect.export.standalone import layers
from rankitect.export.templates import TEMPLATE_MODULES, definitions
from rankitect.space.builder import Head, InputAdapter

# (op, in_shape, params): every op, the branches of every constructor (full/low rank, FFN or not,
# Wukong with and without FMB hidden layers and residual map, DHEN concat/sum, odd D, all modules).
SETTINGS: list[tuple[str, tuple[int, ...], dict[str, Any]]] = [
    ("mlp", (7,), {"width": 5}),
    ("mlp", (6,), {"width": 4, "num_layers": 3, "activation": "gelu", "norm": "none"}),
    ("mlp", (6,), {"width": 3, "num_layers": 2, "activation": "silu"}),
    ("efc", (5, 3), {"out_fields": 4}),
    ("dot", (5, 3), {}),
    ("fm", (5, 3), {}),
    ("dcn", (6,), {"num_layers": 2, "low_rank": 0}),
    ("dcn", (6,), {"num_layers": 2, "low_rank": 3}),
    ("attention", (5, 4), {"num_heads": 2, "ffn": True}),
    ("attention", (4, 6), {"num_heads": 3, "ffn": False}),
    ("wukong", (5, 4), {"fmb_fields": 2, "lcb_fields": 3, "low_rank": 3, "mlp_width": 6, "mlp_layers": 2}),
    ("wukong", (4, 4), {"fmb_fields": 3, "lcb_fields": 3, "low_rank": 2, "mlp_width": 4, "mlp_layers": 0}),
    ("dhen", (5, 4), {"modules": ["dot", "attention", "linear", "dcn", "fm"], "out_fields": 3}),
    ("dhen", (4, 3), {"modules": ["fm", "linear", "attention"], "out_fields": 4, "combine": "sum"}),
    ("gating", (5, 6), {"width": 4}),
    ("sum", (5, 6), {"width": 4}),
]


def twin_class(op: str) -> type[torch.nn.Module]:
    name = OP_CLASSES[op]
    for module in TEMPLATE_MODULES:
        if hasattr(module, name):
            return getattr(module, name)
    raise AssertionError(f"no twin class {name}")


def request_cases(op: str, in_shape: tuple[int, ...]) -> list[Any]:
    """Unmasked, then request counts from none to all: 0, 1, about half, all (pairs for two inputs)."""
    sizes = in_shape[: BLOCKS[op].num_inputs]
    picks = [[0, 1, max(1, n // 2), n] for n in sizes]
    if len(sizes) == 2:
        return [None] + [(a, b) for a, b in zip(*picks)] + [(0, sizes[1]), (sizes[0], 1)]
    return [None] + picks[0]


CASES = [
    pytest.param(op, shape, params, r, share, id=f"{op}-{i}-r{r}-share{share}")
    for i, (op, shape, params) in enumerate(SETTINGS)
    for r in request_cases(op, shape)
    for share in ((None, 0.75) if takes_share(op) and r is not None else (None,))
]


def test_settings_and_twins_cover_the_registry() -> None:
    assert {op for op, _, _ in SETTINGS} == set(BLOCKS) == set(OP_CLASSES) == set(PARAM_SCHEMA)
    for op in BLOCKS:
        twin = inspect.signature(twin_class(op).__init__).parameters
        original = inspect.signature(BLOCKS[op].__init__).parameters
        assert list(twin) == list(original), op
        for name, p in original.items():
            assert (twin[name].kind, twin[name].default) == (p.kind, p.default), (op, name)


def test_param_schema_matches_the_blocks() -> None:
    for op in BLOCKS:
        assert set(PARAM_SCHEMA[op]) == set(block_params(op)), op
    assert set(layers.ACTIVATIONS) == set(ACTIVATIONS) and tuple(layers.NORMS) == tuple(NORMS)
    assert DHEN_MODULES == MODULES and DHEN_COMBINES == COMBINES


def test_twin_modules_define_each_name_once() -> None:
    names = [d.name for d in definitions()]
    assert len(names) == len(set(names)) and set(OP_CLASSES.values()) <= set(names)


def make_inputs(op: str, in_shape: tuple[int, ...], batch: int, gen: torch.Generator) -> list[torch.Tensor]:
    if BLOCKS[op].num_inputs == 2:
        return [torch.randn(batch, n, generator=gen) for n in in_shape]
    return [torch.randn(batch, *in_shape, generator=gen)]


@pytest.mark.parametrize(("op", "in_shape", "params", "request_in", "share"), CASES)
def test_twin_equals_block(
    op: str, in_shape: tuple[int, ...], params: dict[str, Any], request_in: Any, share: float | None
) -> None:
    torch.manual_seed(0)
    block = build_block(op, in_shape, params, request_in=request_in, rocs_share=share)
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.2 * torch.randn_like(p))
    masking = {"request_in": request_in, **({"rocs_share": share} if share is not None else {})}
    twin = twin_class(op)(*in_shape, **params, **masking)
    assert list(twin.state_dict()) == list(block.state_dict())
    twin.load_state_dict(block.state_dict())
    gen = torch.Generator().manual_seed(1)
    for batch in (1, 5):
        xs = make_inputs(op, in_shape, batch, gen)
        with torch.no_grad():
            expected, got = block(*xs), twin(*xs)
        assert got.shape == expected.shape == (batch, *block.out_shape)
        assert torch.equal(got, expected)


ADAPTER_CASES = [
    ([(6,), (3, 4)], [2, 1], "flat", 1, 1),
    ([(6,), (3, 4), (5,)], [2, 1, 0], "flat", 2, 1),
    ([(6,)], [1], "flat", 2, 1),
    ([(3, 4), (6,), (2, 4), (5,)], [1, 2, 2, 1], "field", 1, 3),
    ([(3, 4), (2, 4)], [1, 0], "field", 1, 1),
]


@pytest.mark.parametrize(("masked", "share"), [(False, None), (True, None), (True, 0.75)])
@pytest.mark.parametrize(("shapes", "requests", "in_kind", "num_inputs", "tokens"), ADAPTER_CASES)
def test_adapter_and_head_twins(
    shapes: list[tuple[int, ...]], requests: list[int], in_kind: str, num_inputs: int, tokens: int, masked: bool,
    share: float | None,
) -> None:
    requests = requests if masked else [0] * len(requests)
    kw = {"in_kind": in_kind, "num_inputs": num_inputs, "tokens": tokens, "dim": 4, "masked": masked,
          "rocs_share": share}
    torch.manual_seed(0)
    original = InputAdapter(shapes, requests, **kw)
    twin = layers.InputAdapter(shapes, requests, **kw)
    assert list(twin.state_dict()) == list(original.state_dict())
    twin.load_state_dict(original.state_dict())
    gen = torch.Generator().manual_seed(2)
    xs = [torch.randn(3, *s, generator=gen) for s in shapes]
    with torch.no_grad():
        for a, b in zip(original(xs), twin(xs), strict=True):
            assert torch.equal(a, b)
    head_kw = {"request_in": 2, "rocs_share": share} if masked else {}
    head, head_twin = Head(7, [5, 3], **head_kw), layers.Head(7, [5, 3], **head_kw)
    assert list(head_twin.state_dict()) == list(head.state_dict())
    head_twin.load_state_dict(head.state_dict())
    x = torch.randn(3, 7, generator=gen)
    assert torch.equal(head(x), head_twin(x))
