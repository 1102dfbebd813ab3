"""Standalone shared layers: masked linear maps, split LayerNorm, input adapter, head, embeddings.

Twins of :mod:`rankitect.blocks.common` and of the builder's ``InputAdapter`` and ``Head``
(:mod:`rankitect.space.builder`). Copied verbatim into exported ``model.py`` files, so this module
imports only ``math`` and ``torch``.
"""

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "none": nn.Identity}
NORMS = ("layernorm", "none")


def request_share(request_in: int | None, size_in: int, size_out: int, share: float | None = None) -> int:
    """Request-side outputs for ``request_in`` of ``size_in`` request-side inputs (0: unmasked):
    proportional to the input share, or ``round(share * size_out)``, kept in [1, size_out - 1]."""
    if not request_in:
        return 0
    if request_in >= size_in:
        return size_out
    if size_out < 2:
        return 0
    if share is None:
        count = (2 * request_in * size_out + size_in) // (2 * size_in)
    else:
        count = round(share * size_out)
    return min(max(count, 1), size_out - 1)


def residual_share(request_in: int | None, size_in: int, size_out: int, share: float | None = None) -> int:
    """Request-side outputs of a block whose shortcut is the identity when ``size_in == size_out``."""
    if size_in == size_out:
        return request_in or 0
    return request_share(request_in, size_in, size_out, share)


class MaskedLinear(nn.Linear):
    """``nn.Linear`` whose first ``request_out`` outputs see only the first ``request_in`` inputs."""

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
        self.request_out = request_out if request_in is not None else 0
        mask = None
        if request_in is not None:
            # Block lower triangular: request rows never read candidate columns.
            mask = torch.ones(out_features, in_features)
            mask[: self.request_out, request_in:] = 0.0
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight if self.mask is None else self.weight * self.mask
        return F.linear(x, weight, self.bias)


class FieldLinear(MaskedLinear):
    """A :class:`MaskedLinear` along the field axis: ``(B, N, D) -> (B, N', D)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, N, D) -> (B, D, N) -> linear over N -> (B, D, N') -> (B, N', D)
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


def layer_norm_part(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """LayerNorm over the last axis; a single unit only gets the affine map."""
    if x.shape[-1] == 1:
        return x * weight + bias
    return F.layer_norm(x, (x.shape[-1],), weight, bias)


class SplitLayerNorm(nn.Module):
    """LayerNorm of a flat vector, the first ``request_in`` units normalized on their own."""

    def __init__(self, features: int, *, request_in: int | None = None) -> None:
        super().__init__()
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


def make_norm(name: str, features: int, *, request_in: int | None = None) -> nn.Module:
    """``"layernorm"`` (split by ``request_in``) or ``"none"``."""
    if name == "none":
        return nn.Identity()
    return SplitLayerNorm(features, request_in=request_in)


def flat(x: torch.Tensor) -> torch.Tensor:
    """A field tensor flattened, a flat one unchanged."""
    return x if x.dim() == 2 else x.reshape(x.shape[0], -1)  # (B, N, D) -> (B, N*D)


def cat_request(xs: list[torch.Tensor], rs: list[int], masked: bool) -> torch.Tensor:
    """Concatenate along dim 1; masked, the request prefixes of all inputs go first."""
    if len(xs) == 1:
        return xs[0]
    if not masked:
        return torch.cat(xs, dim=1)
    return torch.cat([x[:, :r] for x, r in zip(xs, rs)] + [x[:, r:] for x, r in zip(xs, rs)], dim=1)


class InputAdapter(nn.Module):
    """Brings a gene's inputs to its block's kind and arity (flatten; project flat inputs to tokens).

    ``shapes`` are the inputs' ``(N, D)`` or ``(W,)`` shapes, ``requests`` their request-side
    counts (fields or units); ``in_kind`` is ``"field"`` or ``"flat"``.
    """

    def __init__(
        self,
        shapes: list[tuple[int, ...]],
        requests: list[int],
        *,
        in_kind: str,
        num_inputs: int,
        tokens: int,
        dim: int,
        masked: bool,
        rocs_share: float | None = None,
    ) -> None:
        super().__init__()
        self.in_kind, self.num_inputs, self.tokens, self.dim, self.masked = in_kind, num_inputs, tokens, dim, masked
        self.is_field = [len(s) == 2 for s in shapes]
        # Field order makes request fields a prefix, so a flattened field input's request units are too.
        self.flat_r = [r if len(s) == 1 else r * s[1] for s, r in zip(shapes, requests)]
        self.field_r = [r if f else 0 for r, f in zip(requests, self.is_field)]
        self.proj = None
        self.token_r = 0
        flat_w = sum(s[0] for s, f in zip(shapes, self.is_field) if not f)
        if in_kind == "field" and flat_w:
            w_r = sum(r for r, f in zip(self.flat_r, self.is_field) if not f)
            self.token_r = request_share(w_r, flat_w, tokens, rocs_share) if masked else 0
            self.proj = MaskedLinear(
                flat_w, tokens * dim, request_in=w_r if masked else None, request_out=self.token_r * dim
            )

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.in_kind == "field":
            return [self.to_field(xs)]
        flats = [flat(x) for x in xs]
        if self.num_inputs == 2:
            right = cat_request(flats[1:], self.flat_r[1:], self.masked) if len(flats) > 1 else flats[0]
            return [flats[0], right]
        return [cat_request(flats, self.flat_r, self.masked)]

    def to_field(self, xs: list[torch.Tensor]) -> torch.Tensor:
        parts = [x for x, f in zip(xs, self.is_field) if f]
        rs = [r for r, f in zip(self.field_r, self.is_field) if f]
        if self.proj is not None:
            flat_rs = [r for r, f in zip(self.flat_r, self.is_field) if not f]
            w = cat_request([x for x, f in zip(xs, self.is_field) if not f], flat_rs, self.masked)
            B = w.shape[0]
            parts.append(self.proj(w).view(B, self.tokens, self.dim))  # (B, T*D) -> (B, T, D)
            rs.append(self.token_r)
        return cat_request(parts, rs, self.masked)


class Head(nn.Module):
    """``widths`` Linear+ReLU layers, then a Linear to one logit: ``(B, W) -> (B,)``.

    Masked (``request_in`` request units first), the hidden layers are :class:`MaskedLinear`.
    """

    def __init__(
        self,
        in_features: int,
        widths: list[int],
        *,
        request_in: int | None = None,
        rocs_share: float | None = None,
    ) -> None:
        super().__init__()
        sizes = [in_features, *widths]
        layers: list[nn.Module] = []
        request = request_in
        for a, b in zip(sizes[:-1], sizes[1:]):
            if request is None:
                layers += [nn.Linear(a, b), nn.ReLU()]
                continue
            out_request = request_share(request, a, b, rocs_share)
            layers += [MaskedLinear(a, b, request_in=request, request_out=out_request), nn.ReLU()]
            request = out_request
        layers.append(nn.Linear(sizes[-1], 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x).squeeze(-1)  # (B, 1) -> (B,)


class SparseEmbedding(nn.Module):
    """One ``nn.Embedding`` per sparse feature, in field order: ids ``(B, n_sparse)`` -> ``(B, n_sparse, D)``.

    ``order[k]`` is the storage column of field ``k`` (request-side features first). Each row
    has one id per feature, so a table lookup equals rankitect's sum-pooled embedding bag.
    """

    def __init__(self, vocab_sizes: list[int], dim: int, order: list[int]) -> None:
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(v, dim) for v in vocab_sizes)
        self.register_buffer("order", torch.tensor(order, dtype=torch.long), persistent=False)

    def forward(self, sparse_ids: torch.Tensor) -> torch.Tensor:
        ids = sparse_ids.index_select(1, self.order)  # (B, n_sparse): storage order -> field order
        return torch.stack([t(ids[:, k]) for k, t in enumerate(self.tables)], dim=1)  # n x (B, D) -> (B, n, D)
