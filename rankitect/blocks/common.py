"""Shared pieces of the blocks: validation, activations, norms and the ROCS-masked linear maps.

ROCS Generalized Layer Masking (Meta, arXiv 2607.27744) needs one idea everywhere: a linear map
whose first ``request_out`` outputs see only the first ``request_in`` inputs. :class:`MaskedLinear`
is that map (a block-lower-triangular weight mask), :class:`FieldLinear` applies it along the field
axis, and :class:`SplitLayerNorm` normalizes the request part of a flat vector on its own. Every
block composes these, so the masking rule lives in one place.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "none": nn.Identity,
}
NORMS = ("layernorm", "none", "batchnorm")


def check_positive(name: str, value: int) -> int:
    """Return ``value`` if it is an int >= 1, else raise ``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def check_request(request_in: int | None, size: int, what: str = "request_in") -> int | None:
    """Validate a request-side count against the input size it refers to (``None`` = unmasked)."""
    if request_in is None:
        return None
    if isinstance(request_in, bool) or not isinstance(request_in, int) or not 0 <= request_in <= size:
        raise ValueError(f"{what} must be None or an int in [0, {size}], got {request_in!r}")
    return request_in


def check_request_pair(
    request_in: tuple[int, int] | None, left: int, right: int
) -> tuple[int | None, int | None]:
    """Validate the ``(left R, right R)`` pair of a two-input block; ``None`` leaves both unmasked."""
    if request_in is None:
        return None, None
    if not isinstance(request_in, (tuple, list)) or len(request_in) != 2 or None in request_in:
        raise ValueError(f"request_in of a two-input block must be an int pair or None, got {request_in!r}")
    return (
        check_request(request_in[0], left, "request_in[0]"),
        check_request(request_in[1], right, "request_in[1]"),
    )


def check_share(share: float | None, what: str = "rocs_share") -> float | None:
    """Validate a request share: ``None`` (proportional rule) or a float in the open interval (0, 1)."""
    if share is None:
        return None
    if isinstance(share, bool) or not isinstance(share, float) or not 0.0 < share < 1.0:
        raise ValueError(f"{what} must be None or a float in (0, 1), got {share!r}")
    return share


def request_share(request_in: int | None, size_in: int, size_out: int, share: float | None = None) -> int:
    """Request-side outputs for ``request_in`` of ``size_in`` request-side inputs.

    With ``share=None`` proportional to the input share (rounded half up); with a ``share`` in
    (0, 1) that fraction of ``size_out`` (``round(share * size_out)``) whatever the input share.
    Either way at least 1 and at most ``size_out - 1`` so that both sides keep room; all outputs
    when all inputs are request side; 0 when no input is (or unmasked).

    >>> request_share(3, 10, 4), request_share(1, 10, 4), request_share(9, 10, 4)
    (1, 1, 3)
    >>> request_share(None, 10, 4), request_share(0, 10, 4), request_share(10, 10, 4)
    (0, 0, 4)
    >>> request_share(3, 10, 8, 0.75), request_share(3, 10, 8, 0.99), request_share(3, 10, 8, 0.01)
    (6, 7, 1)
    >>> request_share(10, 10, 8, 0.5), request_share(0, 10, 8, 0.5), request_share(3, 10, 1, 0.5)
    (8, 0, 0)
    """
    if not request_in:
        return 0
    if request_in >= size_in:
        return size_out
    if size_out < 2:
        return 0
    if share is None:
        count = (2 * request_in * size_out + size_in) // (2 * size_in)
    else:
        count = round(check_share(share) * size_out)
    return min(max(count, 1), size_out - 1)


def residual_share(request_in: int | None, size_in: int, size_out: int, share: float | None = None) -> int:
    """Request-side outputs of a block whose shortcut is the identity when ``size_in == size_out``.

    An identity shortcut adds input field ``i`` to output field ``i``, so the output keeps the
    input's ``request_in`` request fields; with a field map as shortcut (sizes differ) the share
    rule of :func:`request_share` applies. (Proportional shares give ``request_in`` there anyway.)

    >>> residual_share(2, 6, 6, 0.9), residual_share(2, 6, 4, 0.9), residual_share(None, 6, 6, 0.9)
    (2, 3, 0)
    """
    if size_in == size_out:
        return request_in or 0
    return request_share(request_in, size_in, size_out, share)


def make_activation(name: str) -> nn.Module:
    """The activation module for a string key in :data:`ACTIVATIONS`."""
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; known: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]()


def check_norm(name: str) -> str:
    if name not in NORMS:
        raise ValueError(f"unknown norm {name!r}; known: {list(NORMS)}")
    return name


def check_dropout(p: float, what: str = "dropout") -> float:
    """A dropout probability in [0, 1), as a float."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"{what} must be a number in [0, 1), got {p!r}")
    return float(p)


class MaskedLinear(nn.Linear):
    """``nn.Linear`` whose first ``request_out`` outputs see only the first ``request_in`` inputs.

    The weight is multiplied by a fixed 0/1 mask, zero on rows ``[:request_out]`` x columns
    ``[request_in:]`` (block lower triangular); candidate-side outputs see every input. With
    ``request_in=None`` it is a plain linear map. FLOPs: ``2 * in_features * out_features`` per row.

    >>> lin = MaskedLinear(4, 3, request_in=2, request_out=1)
    >>> lin.mask.tolist()
    [[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
    """

    mask: torch.Tensor | None

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool = True,
        request_in: int | None = None,
        request_out: int = 0,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias)
        check_request(request_in, in_features)
        if not 0 <= request_out <= out_features:
            raise ValueError(f"request_out must be in [0, {out_features}], got {request_out!r}")
        self.request_in = request_in
        self.request_out = request_out if request_in is not None else 0
        mask = None
        if request_in is not None:
            mask = torch.ones(out_features, in_features)
            mask[: self.request_out, request_in:] = 0.0
        self.register_buffer("mask", mask, persistent=False)

    def masked_weight(self) -> torch.Tensor:
        return self.weight if self.mask is None else self.weight * self.mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.masked_weight(), self.bias)

    def flops(self) -> int:
        """FLOPs per row of the input (one matrix-vector product)."""
        return 2 * self.in_features * self.out_features


class FieldLinear(MaskedLinear):
    """A :class:`MaskedLinear` applied along the field axis: ``(B, N, D) -> (B, N', D)``.

    ``in_features``/``out_features`` count fields; the same map is applied to each of the ``D``
    coordinates, so FLOPs per example are ``2 * N * N' * D`` (see :meth:`field_flops`).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, N, D) -> (B, D, N) -> linear over N -> (B, D, N') -> (B, N', D)
        return super().forward(x.transpose(1, 2)).transpose(1, 2)

    def field_flops(self, dim: int) -> int:
        return self.flops() * dim


def layer_norm_part(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """LayerNorm over the last axis; a single unit only gets the affine map (its norm is constant)."""
    if x.shape[-1] == 1:
        return x * weight + bias
    return F.layer_norm(x, (x.shape[-1],), weight, bias)


class SplitLayerNorm(nn.Module):
    """LayerNorm over a flat vector with separate statistics for the request part and the rest.

    Unmasked (``request_in`` None or 0) it is ``nn.LayerNorm(features)``. Masked, the first
    ``request_in`` units are normalized on their own, so they never see candidate-side units, and
    the rest on their own. A part of a single unit is not normalized (a one-unit LayerNorm would
    output the constant bias and erase it); it only gets the affine map.
    """

    def __init__(self, features: int, *, request_in: int | None = None) -> None:
        super().__init__()
        check_request(request_in, features)
        self.features = features
        self.request_in = request_in or 0
        self.weight = nn.Parameter(torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.request_in
        if r == 0 or r == self.features:
            return F.layer_norm(x, (self.features,), self.weight, self.bias)
        head = layer_norm_part(x[..., :r], self.weight[:r], self.bias[:r])
        tail = layer_norm_part(x[..., r:], self.weight[r:], self.bias[r:])
        return torch.cat([head, tail], dim=-1)


class BatchNorm(nn.BatchNorm1d):
    """``nn.BatchNorm1d`` over ``(B, W)`` that also takes a batch of one row.

    A lone row has no batch statistics (its variance is 0; torch refuses it in training), yet it
    comes: the last batch of an epoch, a probe, a request scored alone. Such a row is normalized
    by the running statistics, which it leaves unchanged; without running statistics (the
    supernet's), by its own, which map every unit to 0 before the affine map: ``y = bias``.

    >>> norm = BatchNorm(3).train()
    >>> norm(torch.randn(1, 3)).shape, int(norm.num_batches_tracked)
    (torch.Size([1, 3]), 0)
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != 1 or not (self.training or self.running_mean is None):
            return super().forward(x)
        if self.running_mean is not None and self.running_var is not None:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        zero = x * 0.0  # (1, W): the lone row minus its own mean; keeps the graph
        return zero + self.bias if self.bias is not None else zero


def make_norm(name: str, features: int, *, request_in: int | None = None) -> nn.Module:
    """A norm over a flat vector by string key (``"layernorm"`` is masked by ``request_in``).

    ``"batchnorm"`` normalizes each unit on its own (over the batch), so it needs no masking: a
    request unit stays a function of request units.
    """
    if check_norm(name) == "none":
        return nn.Identity()
    if name == "batchnorm":
        return BatchNorm(features)
    return SplitLayerNorm(features, request_in=request_in)


__all__ = [
    "ACTIVATIONS",
    "NORMS",
    "BatchNorm",
    "FieldLinear",
    "MaskedLinear",
    "SplitLayerNorm",
    "check_dropout",
    "check_norm",
    "check_positive",
    "check_request",
    "check_request_pair",
    "check_share",
    "make_activation",
    "make_norm",
    "request_share",
    "residual_share",
]
