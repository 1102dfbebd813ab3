"""The block contract and the one registry of blocks.

Two tensor kinds flow between blocks: *field* tensors ``(B, N, D)`` and *flat* tensors ``(B, W)``.
Every block declares the kind it takes (``in_kind``), the kind it gives (``out_kind``) and how many
inputs it takes (``num_inputs``: 1, or 2 for ``left``/``right`` blocks such as gating and sum).
A third kind, ``sequence``, only history blocks take: a
:class:`~rankitect.blocks.sequence.History` (a user's item embeddings ``(B, L, D)``, their mask and
the candidate item ``(B, D)``); its input shape is ``(max_len, dim)`` and a block that reads the
candidate says so (``uses_target``).

Construction (the only path is :func:`build_block`, used by the space, the supernet and the tests):

* the input shape comes first and positionally: ``(in_fields, dim)`` for a field input,
  ``(in_features,)`` for a flat input, ``(left_features, right_features)`` for two flat inputs;
* then the block's own parameters, keyword-only; these are exactly the ``params`` of a gene;
* then ``request_in`` (keyword-only): ``None`` runs unmasked; an int ``R`` (a pair for two-input
  blocks) says the first ``R`` fields (field input) or units (flat input) are request side, and the
  block then runs *masked* (ROCS Generalized Layer Masking): its first ``request_out`` outputs
  depend only on those request-side inputs;
* then, for blocks whose masked layers choose how many of their outputs are request side,
  ``rocs_share`` (keyword-only): ``None`` for the proportional rule, or the fraction in (0, 1) of
  each such layer's outputs that are request side (:func:`rankitect.blocks.common.request_share`).
  Blocks without a choice (the request side of their outputs follows from their structure) do not
  take it, and :func:`build_block` passes it only to blocks that do.

After construction a block knows ``out_shape`` (``(N', D)`` or ``(W,)``), ``request_out`` (0 when
unmasked) and :meth:`Block.flops`, the forward FLOPs per example of exactly what ``forward``
computes. FLOPs follow ``torch.utils.flop_counter``: matrix products only (mm, addmm, bmm, baddbmm;
a multiply-add is 2); elementwise work, norms and activations count 0; embedding lookups are free.

Everything else about an op lives on its class too, so adding a block touches one file:

* :meth:`Block.forward_split`: the forward on ROCS splits (:mod:`rankitect.blocks.split`), the
  request part once per request; the default runs the block per candidate (correct, saves nothing);
* :meth:`Block.slice_from` and :meth:`Block.widest`: its supernet weight-sharing rule
  (:mod:`rankitect.blocks.slicing`); the default has none;
* :meth:`Block.param_schema`: the types of its gene params, read from the typed constructor.

Block modules import only torch, the standard library, each other and :mod:`rankitect.registry`
(itself the standard library only), so the exporter copies their source into a standalone
``model.py`` (:mod:`rankitect.export.bundle`).
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from rankitect.blocks.common import check_share
from rankitect.blocks.slicing import InPos, Params, Take, pick
from rankitect.blocks.split import Split, fallback
from rankitect.registry import Registry

FIELD = "field"
FLAT = "flat"
SEQUENCE = "sequence"


class Block(nn.Module):
    """Base class of every registered block (see the module docstring for the contract)."""

    in_kind: ClassVar[str] = FLAT
    out_kind: ClassVar[str] = FLAT
    num_inputs: ClassVar[int] = 1
    mixes_fields: ClassVar[bool] = True  # False for blocks where masking is meaningless
    input_gradients: ClassVar[bool] = True  # False for blocks piecewise constant in their input (buckets)
    uses_target: ClassVar[bool] = False  # a history block that reads the candidate item (History.target)

    op_name: ClassVar[str] = ""  # set by :func:`register_block`
    # Gene params added after genotypes were first stored: at their default they stay out of a
    # gene's JSON, so the JSON and hash of an older genotype do not change.
    late_params: ClassVar[tuple[str, ...]] = ()

    out_shape: tuple[int, ...]
    request_out: int

    def flops(self) -> int:
        """Forward FLOPs per example (matrix products, multiply-add = 2)."""
        raise NotImplementedError

    def forward_split(self, *xs: Split) -> Split:
        """``forward`` on ROCS splits, the output cut at ``request_out``: request part once per request.

        The default runs the block per candidate on the broadcast inputs (correct, saves nothing).
        """
        return fallback(self, *xs)

    def slice_from(self, widest: Block, in_pos: InPos, take: Take = pick) -> tuple[Params, torch.Tensor]:
        """This block's parameters cut by ``take`` from ``widest`` (the same op at its widest), and
        the positions of its outputs in the widest output (:mod:`rankitect.blocks.slicing`)."""
        raise ValueError(f"supernet: block op {self.op_name or type(self).__name__!r} has no weight-sharing rule")

    @classmethod
    def widest(cls, in_shape: tuple[int, ...], params: Mapping[str, Any]) -> tuple[tuple[int, ...], dict]:
        """The widest block's input shape and params, adjusted so that every optional part exists."""
        return in_shape, dict(params)

    @classmethod
    def param_schema(cls) -> dict[str, Any]:
        """Gene param name -> its type, read from the typed keyword-only constructor arguments.

        >>> from rankitect.blocks.dcn import DCN
        >>> DCN.param_schema()
        {'num_layers': <class 'int'>, 'low_rank': <class 'int'>}
        """
        hints = typing.get_type_hints(cls.__init__)
        return {
            n: hints.get(n, Any)
            for n, p in _init_parameters(cls).items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and n not in MASKING_ARGS
        }

    def extra_repr(self) -> str:
        return f"out_shape={tuple(self.out_shape)}, request_out={self.request_out}"


BLOCKS: Registry[type[Block]] = Registry("block op", base=Block)
MASKING_ARGS = ("request_in", "rocs_share")


def register_block(name: str) -> Callable[[type[Block]], type[Block]]:
    """Class decorator adding a block to :data:`BLOCKS` as op ``name``; a second block of one name
    is an error."""

    def wrap(cls: type[Block]) -> type[Block]:
        BLOCKS.add(name, cls)
        cls.op_name = name
        return cls

    return wrap


@functools.cache
def _init_parameters(cls: type[Block]) -> Mapping[str, inspect.Parameter]:
    """The parameters of ``cls.__init__`` (cached: decoding asks for them on every gene)."""
    return inspect.signature(cls.__init__).parameters


def block_params(op: str) -> dict[str, inspect.Parameter]:
    """The keyword-only parameters (gene params) a registered block accepts, ``request_in`` and
    ``rocs_share`` (masking, set by the architecture) excluded."""
    return {
        n: p
        for n, p in _init_parameters(get_block_class(op)).items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and n not in MASKING_ARGS
    }


def takes_share(op: str) -> bool:
    """Whether block ``op`` takes ``rocs_share`` (it has masked layers with a free request share)."""
    return "rocs_share" in _init_parameters(get_block_class(op))


def get_block_class(op: str) -> type[Block]:
    """The block class of op ``op``; an unknown op is a ``ValueError`` listing the known ones."""
    return BLOCKS[op]


def build_block(
    op: str,
    in_shape: tuple[int, ...],
    params: dict[str, Any] | None = None,
    *,
    request_in: int | tuple[int, int] | None = None,
    rocs_share: float | None = None,
) -> Block:
    """Construct block ``op`` for an input of ``in_shape`` with gene ``params``.

    ``request_in`` and ``rocs_share`` set the ROCS masking (module docstring); ``rocs_share`` reaches
    only blocks that take it. Unknown or missing parameters raise ``ValueError`` naming the op and
    the key.
    """
    cls = get_block_class(op)
    params = dict(params or {})
    accepted = block_params(op)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(f"block {op!r}: unknown params {unknown}; accepted: {sorted(accepted)}")
    missing = sorted(n for n, p in accepted.items() if p.default is inspect.Parameter.empty and n not in params)
    if missing:
        raise ValueError(f"block {op!r}: missing params {missing}")
    check_share(rocs_share)
    if takes_share(op):
        return cls(*in_shape, **params, request_in=request_in, rocs_share=rocs_share)
    return cls(*in_shape, **params, request_in=request_in)


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


__all__ = [
    "BLOCKS",
    "FIELD",
    "FLAT",
    "MASKING_ARGS",
    "SEQUENCE",
    "Block",
    "block_params",
    "build_block",
    "count_params",
    "get_block_class",
    "register_block",
    "takes_share",
]
