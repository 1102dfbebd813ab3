"""Turn an :class:`~rankitect.space.architecture.Architecture` into a plain ``nn.Module``.

Inputs: ``"sparse"`` is the :class:`~rankitect.space.embedding.SparseEmbedding` field tensor
``(B, n_sparse, D)`` (field order); ``"dense"`` is ``batch.dense`` ``(B, n_dense)``;
``"history:<name>"`` is a :class:`~rankitect.blocks.sequence.History` (the history stem,
:mod:`rankitect.space.history`), which a history block reads as it is. A gene's inputs are adapted
to what its block takes (:class:`InputAdapter`):

* flat block: every input flattened (``(B, N, D) -> (B, N*D)``) and concatenated, in listed order;
* two-input flat block: ``left`` = the first input, ``right`` = the rest concatenated
  (``right = left`` when there is only one input);
* field block: field inputs concatenated along the field axis in listed order, then the flat
  inputs, concatenated, projected by one Linear ``(B, W) -> (B, tokens*D)`` and viewed as
  ``tokens`` extra fields ``(B, tokens, D)`` appended last (``tokens`` is the gene's, 1 by default:
  DLRM's projection of the dense vector to one embedding).

The head flattens and concatenates its inputs, then ``widths`` Linear(+norm)+ReLU(+dropout) layers and a Linear to
one logit. With ``arch.rocs`` every tensor carries its request-side count (fields or units, always
a prefix): concatenations put the request parts of all inputs first (the head's too), dense
features are reordered request side first, and blocks, token projections and the head's hidden
layers are built masked (``request_in``, with ``arch.rocs_share`` as the request share of each
masked layer's outputs), so request-side outputs depend on request-side inputs only (ROCS
Generalized Layer Masking). The head's last Linear reads every unit.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import nn

from rankitect.blocks.base import FIELD, SEQUENCE, Block, build_block, get_block_class
from rankitect.blocks.common import MaskedLinear, check_dropout, make_norm, request_share
from rankitect.space.embedding import SparseEmbedding
from rankitect.data.batch import Batch
from rankitect.data.spec import FeatureSpec
from rankitect.space.architecture import Architecture, InputRef, history_ref
from rankitect.space.history import HistoryInputs, shares_a_table

Shape = tuple[int, ...]


def _cat(xs: Sequence[torch.Tensor], rs: Sequence[int], masked: bool) -> torch.Tensor:
    """Concatenate along dim 1; masked, the request prefixes of all inputs go first."""
    if len(xs) == 1:
        return xs[0]
    if not masked:
        return torch.cat(list(xs), dim=1)
    return torch.cat([x[:, :r] for x, r in zip(xs, rs)] + [x[:, r:] for x, r in zip(xs, rs)], dim=1)


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x if x.dim() == 2 else x.reshape(x.shape[0], -1)  # (B, N, D) -> (B, N*D)


def _flat_size(shape: Shape) -> int:
    return shape[0] if len(shape) == 1 else shape[0] * shape[1]


def _flat_r(shape: Shape, r: int) -> int:
    """Request units of a flattened input: field order makes the request fields a prefix."""
    return r if len(shape) == 1 else r * shape[1]


class InputAdapter(nn.Module):
    """Brings a gene's input tensors to the kind and arity its block takes (see module docstring).

    Args:
        shapes: per input, ``(N, D)`` (field) or ``(W,)`` (flat), without the batch axis.
        requests: per input, its request-side count (all 0 when unmasked).
        in_kind: the block's input kind, ``"field"`` or ``"flat"``.
        num_inputs: 1, or 2 for ``left``/``right`` blocks.
        tokens: fields the flat inputs of a field block are projected to.
        dim: the embedding dimension ``D``.
        masked: whether ROCS masking is on.
        rocs_share: request share of the token projection's outputs (``None``: proportional).
    """

    def __init__(
        self,
        shapes: Sequence[Shape],
        requests: Sequence[int],
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
        self.rocs_share = rocs_share
        self.is_field = [len(s) == 2 for s in shapes]
        self.flat_r = [_flat_r(s, r) for s, r in zip(shapes, requests)]
        self.field_r = [r if f else 0 for r, f in zip(requests, self.is_field)]
        self.proj: MaskedLinear | None = None
        if in_kind == SEQUENCE:  # a history, read as it is
            self.out_shape = tuple(shapes[0])
            self.request_in = requests[0] if masked else None
        elif in_kind == FIELD:
            self._init_field(shapes, requests)
        elif num_inputs == 2:
            rest = list(range(1, len(shapes))) or [0]
            self.out_shape = (_flat_size(shapes[0]), sum(_flat_size(shapes[i]) for i in rest))
            self.request_in: int | tuple[int, int] | None = (
                (self.flat_r[0], sum(self.flat_r[i] for i in rest)) if masked else None
            )
        else:
            self.out_shape = (sum(_flat_size(s) for s in shapes),)
            self.request_in = sum(self.flat_r) if masked else None

    def _init_field(self, shapes: Sequence[Shape], requests: Sequence[int]) -> None:
        fields = sum(s[0] for s, f in zip(shapes, self.is_field) if f)
        field_r = sum(self.field_r)
        flat_w = sum(s[0] for s, f in zip(shapes, self.is_field) if not f)
        token_r = 0
        if flat_w:
            w_r = sum(r for r, f in zip(self.flat_r, self.is_field) if not f)
            token_r = request_share(w_r, flat_w, self.tokens, self.rocs_share) if self.masked else 0
            self.proj = MaskedLinear(
                flat_w, self.tokens * self.dim, request_in=w_r if self.masked else None, request_out=token_r * self.dim
            )
            fields += self.tokens
        self.token_r = token_r
        self.out_shape = (fields, self.dim)
        self.request_in = field_r + token_r if self.masked else None

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.in_kind == SEQUENCE:
            return xs
        if self.in_kind == FIELD:
            return [self._to_field(xs)]
        flats = [_flat(x) for x in xs]
        if self.num_inputs == 2:
            right = _cat(flats[1:], self.flat_r[1:], self.masked) if len(flats) > 1 else flats[0]
            return [flats[0], right]
        return [_cat(flats, self.flat_r, self.masked)]

    def _to_field(self, xs: list[torch.Tensor]) -> torch.Tensor:
        parts = [x for x, f in zip(xs, self.is_field) if f]
        rs = [r for r, f in zip(self.field_r, self.is_field) if f]
        if self.proj is not None:
            flat_rs = [r for r, f in zip(self.flat_r, self.is_field) if not f]
            w = _cat([x for x, f in zip(xs, self.is_field) if not f], flat_rs, self.masked)
            B = w.shape[0]
            parts.append(self.proj(w).view(B, self.tokens, self.dim))  # (B, T*D) -> (B, T, D)
            rs.append(self.token_r)
        return _cat(parts, rs, self.masked)

    def flops(self) -> int:
        return self.proj.flops() if self.proj is not None else 0


class Head(nn.Module):
    """``widths`` hidden layers (Linear, ``norm``, ReLU, dropout), then a Linear to one logit: ``(B, W) -> (B,)``.

    Norms (``"layernorm"``, ``"batchnorm"``; ``"none"`` by default) sit in ``norms`` and dropout
    in one ``dropout`` module applied after every hidden ReLU, both outside ``mlp``, so a head
    without them keeps the state-dict names it always had.

    Masked (``request_in`` request-side units, a prefix of the input), every hidden layer is a
    :class:`MaskedLinear` whose first ``request_share(.., rocs_share)`` units see only request
    units, so ROCS serving computes them once per request; the last Linear reads every unit.
    ``request_out`` is the request units of the last hidden layer (of the input without one).

    >>> head = Head(6, [4, 2], request_in=2, rocs_share=0.75)
    >>> [m.request_out for m in head.mlp if isinstance(m, MaskedLinear)], head.request_out
    ([3, 1], 1)
    """

    def __init__(
        self,
        in_features: int,
        widths: Sequence[int],
        *,
        request_in: int | None = None,
        rocs_share: float | None = None,
        dropout: float = 0.0,
        norm: str = "none",
    ) -> None:
        super().__init__()
        sizes = [in_features, *widths]
        layers: list[nn.Module] = []
        norms: list[nn.Module] = []
        request = request_in
        for a, b in zip(sizes[:-1], sizes[1:]):
            if request is None:
                layers += [nn.Linear(a, b), nn.ReLU()]
                norms.append(make_norm(norm, b))
                continue
            out_request = request_share(request, a, b, rocs_share)
            layers += [MaskedLinear(a, b, request_in=request, request_out=out_request), nn.ReLU()]
            norms.append(make_norm(norm, b, request_in=out_request))
            request = out_request
        layers.append(nn.Linear(sizes[-1], 1))
        self.mlp = nn.Sequential(*layers)
        self.norms = nn.ModuleList(norms) if norm != "none" else None
        self.dropout = nn.Dropout(check_dropout(dropout))
        self.request_in, self.request_out = request_in, request or 0
        self._flops = sum(2 * a * b for a, b in zip(sizes, [*sizes[1:], 1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norms is None and self.dropout.p == 0.0:
            return self.mlp(x).squeeze(-1)  # (B, 1) -> (B,)
        for j in range(0, len(self.mlp) - 1, 2):  # Linear, (norm), ReLU, dropout
            x = self.mlp[j](x)
            if self.norms is not None:
                x = self.norms[j // 2](x)
            x = self.dropout(self.mlp[j + 1](x))
        return self.mlp[-1](x).squeeze(-1)  # (B, 1) -> (B,)

    def flops(self) -> int:
        return self._flops


class DenseStandardizer(nn.Module):
    """``(x - mean) / std`` per dense column, with the training statistics the feature spec carries
    (:class:`~rankitect.data.spec.DenseFeature`): every model's first step on ``batch.dense``.

    The statistics are constants of the data the model was built for (non-persistent buffers, so a
    ``state_dict`` holds only trained weights); a spec without statistics leaves ``x`` as it is.

    >>> from rankitect.data.spec import DenseFeature, FeatureSpec
    >>> spec = FeatureSpec(dense=(DenseFeature("a", mean=12.0, std=0.5),), sparse=())
    >>> DenseStandardizer(spec)(torch.tensor([[12.0], [13.0]])).tolist()
    [[0.0], [2.0]]
    """

    def __init__(self, spec: FeatureSpec) -> None:
        super().__init__()
        self.identity = all(f.mean == 0.0 and f.std == 1.0 for f in spec.dense)
        self.register_buffer("mean", torch.tensor(dense_means(spec), dtype=torch.float32), persistent=False)
        self.register_buffer("inv_std", torch.tensor(dense_inv_stds(spec), dtype=torch.float32), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.identity else (x - self.mean) * self.inv_std


def dense_means(spec: FeatureSpec) -> list[float]:
    """The dense columns' training means (storage order)."""
    return [float(f.mean) for f in spec.dense]


def dense_inv_stds(spec: FeatureSpec) -> list[float]:
    """``1 / std`` of the dense columns (storage order), as the models multiply by it."""
    return [1.0 / float(f.std) for f in spec.dense]


class RankingModel(nn.Module):
    """The model of one architecture: ``forward(batch) -> logits (B,)``.

    Build it with :func:`build_model`. ``sparse_parameters()`` are the embedding tables (for a
    rowwise Adagrad), ``dense_parameters()`` everything else (for Adam).
    """

    def __init__(self, arch: Architecture, spec: FeatureSpec) -> None:
        super().__init__()
        self.arch, self.spec = arch, spec
        masked, D = arch.rocs, arch.embedding_dim
        shared = shares_a_table(arch, spec)  # a history looks its ids up in a sparse feature's table
        self.embedding = SparseEmbedding(spec, D, recipe=arch.recipe) if arch.uses("sparse") or shared else None
        self.history = HistoryInputs(arch, spec, D) if arch.histories() else None
        shapes: dict[InputRef, Shape] = {}
        requests: dict[InputRef, int] = {}
        if arch.uses("sparse"):
            shapes["sparse"], requests["sparse"] = (spec.n_sparse, D), spec.n_request_sparse if masked else 0
        for f in self.history.features if self.history is not None else []:  # a history is request side
            shapes[history_ref(f.name)], requests[history_ref(f.name)] = (f.max_len, D), f.max_len if masked else 0
        if arch.uses("dense"):
            if spec.n_dense == 0:
                raise ValueError("architecture reads 'dense' but the feature spec has no dense features")
            shapes["dense"], requests["dense"] = (spec.n_dense,), spec.n_request_dense if masked else 0
        order = [i for i, f in enumerate(spec.dense) if f.side == "request"]
        order += [i for i, f in enumerate(spec.dense) if f.side != "request"]
        self.register_buffer("dense_order", torch.tensor(order, dtype=torch.long), persistent=False)
        self.standardize = DenseStandardizer(spec)
        self.adapters = nn.ModuleList()
        self.blocks = nn.ModuleList()
        for i, gene in enumerate(arch.blocks):
            adapter, block = self._build_gene(i, shapes, requests)
            self.adapters.append(adapter)
            self.blocks.append(block)
            shapes[i], requests[i] = tuple(block.out_shape), block.request_out
        head_shapes = [shapes[r] for r in arch.head.inputs]
        self.head_r = [_flat_r(s, requests[r]) for s, r in zip(head_shapes, arch.head.inputs)]
        self.head = Head(
            sum(_flat_size(s) for s in head_shapes),
            arch.head.widths,
            request_in=sum(self.head_r) if masked else None,
            rocs_share=arch.rocs_share,
            dropout=arch.head.dropout,
            norm=arch.head.norm,
        )

    def _build_gene(
        self, i: int, shapes: dict[InputRef, Shape], requests: dict[InputRef, int]
    ) -> tuple[InputAdapter, Block]:
        gene, arch = self.arch.blocks[i], self.arch
        adapter = InputAdapter(
            [shapes[r] for r in gene.inputs],
            [requests[r] for r in gene.inputs],
            in_kind=gene.in_kind,
            num_inputs=get_block_class(gene.op).num_inputs,
            tokens=gene.tokens,
            dim=arch.embedding_dim,
            masked=arch.rocs,
            rocs_share=arch.rocs_share,
        )
        try:
            block = build_block(
                gene.op, adapter.out_shape, dict(gene.params), request_in=adapter.request_in, rocs_share=arch.rocs_share
            )
        except ValueError as err:
            raise ValueError(f"blocks[{i}] ({gene.op} on input shape {adapter.out_shape}): {err}") from None
        return adapter, block

    def _dense(self, batch: Batch) -> torch.Tensor | None:
        """``batch.dense`` standardized (and request side first when masked), once per forward."""
        if not self.arch.uses("dense"):
            return None
        dense = self.standardize(batch.dense)
        return dense.index_select(1, self.dense_order) if self.arch.rocs else dense

    @staticmethod
    def _source(ref: InputRef, dense: torch.Tensor | None, emb: torch.Tensor | None,
                outs: list[torch.Tensor], hist: dict | None = None) -> torch.Tensor:
        if hist and ref in hist:
            return hist[ref]
        if ref == "sparse":
            if emb is None:
                raise ValueError("no sparse embedding was built")
            return emb
        if ref == "dense":
            if dense is None:
                raise ValueError("no dense inputs: the architecture reads 'dense' but the feature spec has none")
            return dense
        return outs[int(ref)]

    def forward(self, batch: Batch) -> torch.Tensor:
        emb = self.embedding(batch.sparse) if self.embedding is not None else None
        return self.forward_dense(batch, emb)

    def forward_with_l2(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``(B,)`` and the squared L2 norm of the batch's looked-up embedding rows, averaged
        over the batch: ``mean_b sum_f ||e_bf||^2`` (a 0-d tensor; 0 without sparse inputs), the
        penalty the recipe's ``embedding_l2`` weighs. One lookup serves both."""
        if self.embedding is None:
            return self.forward_dense(batch, None), torch.zeros(())
        rows = self.embedding.lookup(batch.sparse)  # (B, sum_f d_f)
        return self.forward_dense(batch, self.embedding.to_fields(rows)), rows.pow(2).sum(dim=1).mean()

    def forward_dense(self, batch: Batch, emb: torch.Tensor | None) -> torch.Tensor:
        """Logits from the looked-up fields ``emb`` ``(B, n_sparse, D)`` and ``batch.dense``: every
        layer after the embedding lookup (``runtime.compile`` compiles this part alone)."""
        dense = self._dense(batch)
        hist = self.history(batch, self.embedding, emb) if self.history is not None else None
        outs: list[torch.Tensor] = []
        for gene, adapter, block in zip(self.arch.blocks, self.adapters, self.blocks):
            xs = adapter([self._source(r, dense, emb, outs, hist) for r in gene.inputs])
            outs.append(block(*xs))
        feats = [_flat(self._source(r, dense, emb, outs)) for r in self.arch.head.inputs]
        return self.head(_cat(feats, self.head_r, self.arch.rocs))

    def flops(self) -> int:
        """Forward FLOPs per example: embedding projections (of the fields and the histories' rows),
        blocks, input projections and head (lookups are free)."""
        adapters = sum(a.flops() for a in self.adapters)
        blocks = sum(b.flops() for b in self.blocks)
        stem = self.embedding.flops() if self.embedding is not None and self.arch.uses("sparse") else 0
        if self.history is not None:
            stem += self.history.flops(self.embedding)
        return stem + adapters + blocks + self.head.flops()

    def sparse_parameters(self) -> Iterator[nn.Parameter]:
        """The embedding tables (a history's own ones included)."""
        tables = list(self.embedding.sparse_parameters()) if self.embedding is not None else []
        return iter(tables + (self.history.sparse_parameters() if self.history is not None else []))

    def dense_parameters(self) -> Iterator[nn.Parameter]:
        """Every parameter that is not an embedding table."""
        sparse = {id(p) for p in self.sparse_parameters()}
        return (p for p in self.parameters() if id(p) not in sparse)


def build_model(arch: Architecture, spec: FeatureSpec, *, device: torch.device | str | None = None) -> RankingModel:
    """Build the :class:`RankingModel` of ``arch`` for data described by ``spec``.

    ``device="meta"`` sizes a model (FLOPs, parameter counts) without allocating it.

    >>> from rankitect.space.testing import tiny_batch, tiny_spec
    >>> from rankitect.space.architecture import BlockGene, HeadGene
    >>> arch = Architecture(blocks=(BlockGene("mlp", ("dense",), {"width": 8}),
    ...                             BlockGene("dot", ("sparse", 0))), head=HeadGene((1, 0), (16,)), embedding_dim=4)
    >>> model = build_model(arch, tiny_spec())
    >>> model(tiny_batch(tiny_spec(), 3)).shape
    torch.Size([3])
    """
    if device is None:
        return RankingModel(arch, spec)
    with torch.device(device):
        return RankingModel(arch, spec)
