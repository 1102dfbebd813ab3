"""A tensor cut at its request prefix, and the masked linear maps and norms that act on it.

In a ROCS-masked model every tensor has a request-side prefix (fields or units) that depends only
on request-side inputs. :class:`Split` stores that prefix once per request, ``req`` ``(Q, R[, D])``,
and the rest once per candidate, ``cand`` ``(B, C[, D])``; ``index`` ``(B,)`` names each candidate's
request row. A masked linear map then costs, per candidate, only its candidate x candidate block:
``out_c[b] = W_cc x_c[b] + (W_cu x_u + bias)[index[b]]`` (ROCS in-kernel broadcast), and the
request rows ``out_u = W_uu x_u + bias`` are computed once per request.

Every block computes itself on splits in :meth:`~rankitect.blocks.base.Block.forward_split` with
these maps; a block without its own runs through :func:`fallback`. Imports only torch, so the
exporter can bundle it with the blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rankitect.blocks.common import FieldLinear, MaskedLinear, SplitLayerNorm, layer_norm_part


@dataclass(frozen=True)
class Split:
    """``req``: request part ``(Q, R, ...)``; ``cand``: candidate part ``(B, C, ...)``.

    ``index`` ``(B,)`` is each candidate's request row in ``req``; ``first`` ``(Q,)`` one candidate
    row of each request (to read request-side values off a per-candidate tensor).

    >>> x = Split(torch.ones(2, 1), torch.zeros(3, 2), torch.tensor([0, 0, 1]), torch.tensor([0, 2]))
    >>> x.full().tolist()
    [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    """

    req: torch.Tensor
    cand: torch.Tensor
    index: torch.Tensor
    first: torch.Tensor

    @property
    def request_width(self) -> int:
        return int(self.req.shape[1])

    def like(self, req: torch.Tensor, cand: torch.Tensor) -> Split:
        """A split of the same requests with new parts."""
        return Split(req, cand, self.index, self.first)

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Split:
        """Apply a per-unit (or per-field) function to both parts."""
        return self.like(fn(self.req), fn(self.cand))

    def full(self) -> torch.Tensor:
        """The per-candidate tensor ``(B, R + C, ...)``: request part broadcast, candidate part after."""
        return torch.cat([self.req.index_select(0, self.index), self.cand], dim=1)

    def flat(self) -> Split:
        """Fields flattened: ``(Q, R, D), (B, C, D) -> (Q, R*D), (B, C*D)`` (field order keeps the prefix)."""
        if self.req.dim() == 2:
            return self
        return self.like(self.req.flatten(1), self.cand.flatten(1))

    def fields(self, dim: int) -> Split:
        """Flat units viewed as fields of ``dim``: ``(Q, R*D), (B, C*D) -> (Q, R, D), (B, C, D)``."""
        return self.like(self.req.unflatten(1, (-1, dim)), self.cand.unflatten(1, (-1, dim)))


def cut(full: torch.Tensor, request_width: int, index: torch.Tensor, first: torch.Tensor) -> Split:
    """Split a per-candidate tensor ``(B, N, ...)`` at ``request_width`` (request rows from ``first``)."""
    return Split(full[:, :request_width].index_select(0, first), full[:, request_width:], index, first)


def cat(parts: Sequence[Split]) -> Split:
    """Concatenate along dim 1, request parts first (the builder's masked concatenation)."""
    if len(parts) == 1:
        return parts[0]
    return parts[0].like(torch.cat([p.req for p in parts], dim=1), torch.cat([p.cand for p in parts], dim=1))


def add(a: Split, b: Split) -> Split:
    return a.like(a.req + b.req, a.cand + b.cand)


def _check_width(what: str, module_request: int | None, x: Split) -> int:
    r = module_request or 0
    if r != x.request_width:
        raise ValueError(f"{what}: built for {r} request-side inputs, got a split with {x.request_width}")
    return r


def split_matmul(
    x_req: torch.Tensor, x_cand: torch.Tensor, index: torch.Tensor, weight: torch.Tensor,
    bias: torch.Tensor | None, request_out: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked ``x Wᵀ + b`` on the last axis of a split: ``(Q, .., R), (B, .., C) -> (Q, .., r), (B, .., O-r)``.

    ``weight`` ``(O, R + C)``; its block ``[:request_out, R:]`` is masked to zero and never read.
    """
    R = x_req.shape[-1]
    per_request = F.linear(x_req, weight[:, :R], bias)  # (Q, .., R) @ (R, O) -> (Q, .., O)
    broadcast = per_request[..., request_out:].index_select(0, index)  # (B, .., O - r)
    w_cc = weight[request_out:, R:]  # (O - r, C)
    if x_cand.dim() == 2:
        cand = torch.addmm(broadcast, x_cand, w_cc.t())  # (B, C) @ (C, O-r) + (B, O-r)
    else:
        cand = torch.matmul(x_cand, w_cc.t()) + broadcast  # (B, .., C) @ (C, O-r) -> (B, .., O-r)
    return per_request[..., :request_out], cand


def linear(lin: MaskedLinear, x: Split) -> Split:
    """A :class:`MaskedLinear` on a flat split (request outputs once per request)."""
    _check_width("MaskedLinear", lin.request_in, x)
    req, cand = split_matmul(x.req, x.cand, x.index, lin.weight, lin.bias, lin.request_out)
    return x.like(req, cand)


def plain_linear(weight: torch.Tensor, bias: torch.Tensor | None, x: Split) -> torch.Tensor:
    """An unmasked linear map of a flat split, to a per-candidate ``(B, O)`` (in-kernel broadcast)."""
    _, cand = split_matmul(x.req, x.cand, x.index, weight, bias, 0)
    return cand


def field_linear(lin: FieldLinear, x: Split) -> Split:
    """A :class:`FieldLinear` (along the field axis) on a field split."""
    _check_width("FieldLinear", lin.request_in, x)
    # (Q, R, D) -> (Q, D, R) and (B, C, D) -> (B, D, C): fields on the last axis
    req, cand = split_matmul(
        x.req.transpose(1, 2), x.cand.transpose(1, 2), x.index, lin.weight, lin.bias, lin.request_out
    )
    return x.like(req.transpose(1, 2), cand.transpose(1, 2))  # (Q, D, r) -> (Q, r, D); (B, D, O-r) -> (B, O-r, D)


def split_layer_norm(norm: SplitLayerNorm, x: Split) -> Split:
    """A :class:`SplitLayerNorm`: the request part and the candidate part normalized on their own."""
    r = _check_width("SplitLayerNorm", norm.request_in, x)
    if r == 0:
        return x.like(x.req, F.layer_norm(x.cand, (norm.features,), norm.weight, norm.bias))
    if r == norm.features:
        return x.like(F.layer_norm(x.req, (norm.features,), norm.weight, norm.bias), x.cand)
    return x.like(
        layer_norm_part(x.req, norm.weight[:r], norm.bias[:r]), layer_norm_part(x.cand, norm.weight[r:], norm.bias[r:])
    )


def split_batch_norm(norm: nn.BatchNorm1d, x: Split) -> Split:
    """A batch norm at serving (its running statistics): per unit, so each part takes its own units."""
    r = x.request_width

    def part(t: torch.Tensor, units: slice) -> torch.Tensor:
        if t.shape[-1] == 0:  # a side without units (batch_norm refuses zero channels)
            return t
        mean, var = norm.running_mean, norm.running_var
        return F.batch_norm(t, None if mean is None else mean[units], None if var is None else var[units],
                            norm.weight[units] if norm.weight is not None else None,
                            norm.bias[units] if norm.bias is not None else None, False, 0.0, norm.eps)

    return x.like(part(x.req, slice(0, r)), part(x.cand, slice(r, None)))


def sequential(layers: nn.Sequential, x: Split) -> Split:
    """Masked linears, split LayerNorms and per-unit activations, in order, on a flat split."""
    for layer in layers:
        if isinstance(layer, MaskedLinear):
            x = linear(layer, x)
        elif isinstance(layer, SplitLayerNorm):
            x = split_layer_norm(layer, x)
        elif isinstance(layer, nn.BatchNorm1d):
            x = split_batch_norm(layer, x)
        elif isinstance(layer, (nn.ReLU, nn.GELU, nn.SiLU, nn.Identity, nn.Dropout)):
            x = x.map(layer)
        else:
            raise TypeError(f"no split form for layer {type(layer).__name__}")
    return x


def fallback(block: nn.Module, *xs: Split) -> Split:
    """Run ``block`` per candidate on the broadcast inputs, then cut its output (no FLOPs saved)."""
    out = block(*[x.full() for x in xs])
    return cut(out, block.request_out, xs[0].index, xs[0].first)


__all__ = [
    "Split",
    "add",
    "cat",
    "cut",
    "fallback",
    "field_linear",
    "linear",
    "plain_linear",
    "sequential",
    "split_batch_norm",
    "split_layer_norm",
    "split_matmul",
]
