"""ROCS serving: score candidates with the request-side work done once per request.

In a ROCS-masked model (``arch.rocs``, Meta arXiv 2607.27744) every tensor has a request-side
prefix that depends on request-side features only. :func:`score_requests` therefore computes each
block's request part once per request (on one row per request), its candidate part per candidate,
and broadcasts request-side contributions by gathering them by request index; every masked linear
map costs per candidate only its candidate x candidate block (``W_cc x_c[b] + (W_cu x_u)[req(b)]``),
attention computes a request's keys and values once (candidate queries read them), Wukong's
``X (Xᵀ Y)`` and DLRM's Gram matrix keep only their candidate rows per candidate. The head's
hidden layers are masked too (request units once per request) and its last linear map takes the
same in-kernel broadcast. A history is request side: it is looked up once per request and each
history block encodes it there (Deep Cross Attention's encoder and its keys and values, BST's
history projections, DIN's history term, pooling whole), each candidate reading it with its own
item (:class:`~rankitect.blocks.sequence.HistorySplit`). The scores equal ``model(batch)`` up to
float rounding.

:func:`rocs_cost` counts what that costs with ``torch.utils.flop_counter`` on a meta-device build:
FLOPs once per request plus FLOPs per candidate (the project's convention: matrix products only,
a multiply-add is 2, lookups free).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from rankitect.blocks.base import FIELD, SEQUENCE
from rankitect.blocks.sequence import HistorySplit
from rankitect.data.batch import Batch
from rankitect.data.spec import FeatureSpec
from rankitect.blocks.split import Split, cat, linear, plain_linear, sequential
from rankitect.space.architecture import Architecture, InputRef, history_ref
from rankitect.space.builder import InputAdapter, RankingModel, build_model


def request_rows(request_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(index, first)``: each row's request number ``(B,)`` and each request's first row ``(Q,)``.

    Requests are runs of equal ids (rows of one request are contiguous in a batch).

    >>> index, first = request_rows(torch.tensor([7, 7, 3, 3, 3, 9]))
    >>> index.tolist(), first.tolist()
    ([0, 0, 1, 1, 1, 2], [0, 2, 5])
    """
    _, index, counts = torch.unique_consecutive(request_ids, return_inverse=True, return_counts=True)
    return index, torch.cumsum(counts, 0) - counts


def _check_constant(values: torch.Tensor, index: torch.Tensor, first: torch.Tensor, names: list[str]) -> None:
    """Raise if a request-side column ``(B, k)`` differs between candidates of one request."""
    diff = values != values.index_select(0, first).index_select(0, index)
    if bool(diff.any()):
        row, col = (int(v) for v in diff.nonzero()[0])
        raise ValueError(
            f"request-side feature {names[col]!r} differs within a request (row {row} vs row "
            f"{int(first[index[row]])}); ROCS scoring needs request features constant per request"
        )


def request_sources(model: RankingModel, batch: Batch, index: torch.Tensor, first: torch.Tensor,
                    *, check: bool = True) -> dict[InputRef, Split]:
    """The model's raw inputs as splits: request-side embeddings and dense features once per request."""
    spec, out = model.spec, {}
    if model.embedding is not None:
        ids = batch.sparse_ids()  # (B, n_sparse), key order
        column = {name: j for j, name in enumerate(batch.sparse.keys())}
        names = model.embedding.feature_names  # field order: request side first
        r = spec.n_request_sparse
        req_cols = torch.tensor([column[n] for n in names[:r]], dtype=torch.long)
        if check:
            _check_constant(ids.index_select(1, req_cols), index, first, names[:r])
        out["sparse"] = Split(
            _lookup(model, names[:r], ids.index_select(0, first), column, len(first)),
            _lookup(model, names[r:], ids, column, len(ids)), index, first,
        )
    if model.arch.uses("dense"):
        dense = model.standardize(batch.dense).index_select(1, model.dense_order)  # (B, n_dense), request side first
        r = spec.n_request_dense
        if check:
            _check_constant(dense[:, :r], index, first, [f.name for f in spec.dense if f.side == "request"])
        out["dense"] = Split(dense.index_select(0, first)[:, :r], dense[:, r:], index, first)
    return out | history_sources(model, batch, index, first, check=check)


def history_sources(model: RankingModel, batch: Batch, index: torch.Tensor, first: torch.Tensor,
                    *, check: bool = True) -> dict[InputRef, HistorySplit]:
    """The histories the model reads, looked up once per request, beside each candidate's item."""
    if model.history is None:
        return {}
    out: dict[InputRef, HistorySplit] = {}
    ids_of = batch.sparse_ids()  # (B, n_sparse), key order
    column = {name: j for j, name in enumerate(batch.sparse.keys())}
    for f in model.history.features:
        ids, mask = batch.history_padded(f.name, f.max_len)  # (B, L) each
        if check:
            _check_constant(ids, index, first, [f.name] * f.max_len)
        seq = model.history.embed(f.name, ids.index_select(0, first), model.embedding)  # (Q, L, D)
        if f.shares is not None and model.embedding is not None:
            target = _lookup(model, [f.shares], ids_of, column, len(ids_of))[:, 0]  # (B, D)
        else:
            target = seq.new_zeros(len(ids_of), model.arch.embedding_dim)
        out[history_ref(f.name)] = HistorySplit(seq, mask.index_select(0, first), target, index, first)
    return out


def _lookup(model: RankingModel, names: list[str], ids: torch.Tensor, column: dict[str, int], rows: int) -> torch.Tensor:
    """Embeddings of ``names`` for ``ids`` rows: ``(rows, len(names), D)`` (one id per row: bag = row)."""
    emb = model.embedding
    if not names:
        return emb.table(emb.feature_names[0]).new_zeros(rows, 0, emb.dim)
    return torch.stack([emb.project(n, F.embedding(ids[:, column[n]], emb.table(n))) for n in names], dim=1)


def adapt(adapter: InputAdapter, xs: list[Split]) -> list[Split]:
    """The builder's :class:`InputAdapter` (masked) on splits (a history passes as it is)."""
    if adapter.in_kind == SEQUENCE:
        return xs
    if adapter.in_kind == FIELD:
        fields = [x for x, is_field in zip(xs, adapter.is_field) if is_field]
        if adapter.proj is not None:
            flat = cat([x for x, is_field in zip(xs, adapter.is_field) if not is_field])
            fields.append(linear(adapter.proj, flat).fields(adapter.dim))  # (., T*D) -> (., T, D)
        return [cat(fields)]
    flats = [x.flat() for x in xs]
    if adapter.num_inputs == 2:
        return [flats[0], cat(flats[1:]) if len(flats) > 1 else flats[0]]
    return [cat(flats)]


def _head(model: RankingModel, feats: list[Split]) -> torch.Tensor:
    """The head on flat splits: masked hidden layers with their request units once per request,
    then the last linear map per candidate, reading request units by in-kernel broadcast."""
    layers = list(model.head.mlp)
    norms = list(model.head.norms) if model.head.norms is not None else []
    hidden = [m for j in range(0, len(layers) - 1, 2) for m in (layers[j], *norms[j // 2 : j // 2 + 1], layers[j + 1])]
    # The masked head concatenates its inputs request parts first, as :func:`cat` does.
    h = sequential(nn.Sequential(*hidden), cat(feats))
    last = layers[-1]
    return plain_linear(last.weight, last.bias, h).squeeze(-1)  # (B, 1) -> (B,)


def split_logits(model: RankingModel, sources: dict[InputRef, Split]) -> torch.Tensor:
    """Logits ``(B,)`` of ``model`` from split raw inputs (see :func:`request_sources`)."""
    outs: list[Split] = []

    def source(ref: InputRef) -> Split:
        return sources[ref] if isinstance(ref, str) else outs[int(ref)]

    for gene, adapter, block in zip(model.arch.blocks, model.adapters, model.blocks):
        outs.append(block.forward_split(*adapt(adapter, [source(r) for r in gene.inputs])))
    return _head(model, [source(r).flat() for r in model.arch.head.inputs])


@torch.no_grad()
def score_requests(model: RankingModel, batch: Batch, *, check: bool = True) -> torch.Tensor:
    """Logits ``(B,)`` of a ROCS model, the request-side part computed once per request.

    Equal to ``model(batch)`` up to float rounding. Rows of one request must be contiguous and,
    with ``check``, share their request-side features (else ``ValueError`` names the feature).

    >>> from rankitect.space.testing import tiny_batch, tiny_spec
    >>> from rankitect.space.architecture import BlockGene, HeadGene
    >>> arch = Architecture((BlockGene("mlp", ("dense", "sparse"), {"width": 8}),), HeadGene((0,), (4,)), 4, rocs=True)
    >>> model, batch = build_model(arch, tiny_spec()), tiny_batch(tiny_spec(), 6, per_request=3)
    >>> torch.allclose(score_requests(model, batch), model(batch), atol=1e-6)
    True
    """
    if not model.arch.rocs:
        raise ValueError(f"architecture {model.arch.hash} is not ROCS-masked (rocs=False): score it with model(batch)")
    index, first = request_rows(batch.request_ids)
    return split_logits(model, request_sources(model, batch, index, first, check=check))


@dataclass(frozen=True)
class RocsCost:
    """Forward FLOPs of ROCS scoring: ``per_request`` once per request, ``per_candidate`` per row."""

    per_request: int
    per_candidate: int

    def per_example(self, candidates_per_request: float) -> float:
        """FLOPs per scored candidate with the request part shared by ``candidates_per_request``."""
        if candidates_per_request <= 0:
            raise ValueError(f"candidates_per_request must be > 0, got {candidates_per_request!r}")
        return self.per_candidate + self.per_request / candidates_per_request


def _meta_fields(model: RankingModel, names: list[str], rows: int) -> torch.Tensor:
    """Meta rows of ``names`` as :func:`_lookup` gives them, ``(rows, len(names), D)``: each table's
    width, then its group's projection to ``D`` (counted, as scoring runs it), lookups free."""
    emb = model.embedding
    if not names:
        return torch.empty(rows, 0, emb.dim, device="meta")
    widths = dict(zip(emb.feature_names, emb.dims))
    return torch.stack([emb.project(n, torch.empty(rows, widths[n], device="meta")) for n in names], dim=1)


def _meta_flops(model: RankingModel, requests: int, rows: int) -> int:
    spec = model.spec
    index = torch.zeros(rows, dtype=torch.long, device="meta")
    first = torch.zeros(requests, dtype=torch.long, device="meta")
    sources: dict[InputRef, Split] = {}
    model.eval()  # scoring's mode: a bucket block in training mode would read its edges off meta tensors
    with FlopCounterMode(display=False) as counter:  # the table projections count, as in scoring
        if model.embedding is not None:
            names, r = model.embedding.feature_names, spec.n_request_sparse
            sources["sparse"] = Split(_meta_fields(model, names[:r], requests),
                                      _meta_fields(model, names[r:], rows), index, first)
        if model.arch.uses("dense"):
            r = spec.n_request_dense
            sources["dense"] = Split(torch.empty(requests, r, device="meta"),
                                     torch.empty(rows, spec.n_dense - r, device="meta"), index, first)
        sources.update(_meta_histories(model, index, first))
        split_logits(model, sources)
    return int(counter.get_total_flops())


def _meta_histories(model: RankingModel, index: torch.Tensor, first: torch.Tensor) -> dict[InputRef, HistorySplit]:
    """Meta histories as :func:`history_sources` gives them: looked up (and projected, counted) per request."""
    if model.history is None:
        return {}
    out: dict[InputRef, HistorySplit] = {}
    emb, D = model.embedding, model.arch.embedding_dim
    for f in model.history.features:
        requests, L = first.shape[0], f.max_len
        seq = torch.empty(requests, L, D, device="meta")
        if f.shares is not None and emb is not None:
            width = emb.dims[emb.feature_names.index(f.shares)]
            seq = emb.project(f.shares, torch.empty(requests, L, width, device="meta"))
        target = _meta_fields(model, [f.shares], index.shape[0])[:, 0] if f.shares and emb is not None \
            else torch.empty(index.shape[0], D, device="meta")
        mask = torch.empty(requests, L, dtype=torch.bool, device="meta")
        out[history_ref(f.name)] = HistorySplit(seq, mask, target, index, first)
    return out


def rocs_cost(arch: Architecture, spec: FeatureSpec) -> RocsCost:
    """FLOPs of :func:`score_requests` for ``arch`` on ``spec``, counted on a meta-device build
    (:func:`rankitect.cost.measure` gives them with the plain cost, from the same build)."""
    if not arch.rocs:
        raise ValueError(f"architecture {arch.hash} is not ROCS-masked (rocs=False)")
    return model_rocs_cost(build_model(arch, spec, device="meta"))


def model_rocs_cost(model: RankingModel) -> RocsCost:
    """:func:`rocs_cost` of a model already built on the ``meta`` device (no second build).

    Every product runs either on the request rows or on the candidate rows, so one request with one
    candidate and one with two give both parts.
    """
    if not model.arch.rocs:
        raise ValueError(f"architecture {model.arch.hash} is not ROCS-masked (rocs=False)")
    one, two = _meta_flops(model, 1, 1), _meta_flops(model, 1, 2)
    return RocsCost(per_request=one - (two - one), per_candidate=two - one)


def rocs_flops(arch: Architecture, spec: FeatureSpec, candidates_per_request: float) -> tuple[float, int]:
    """``(per_example, per_request)``: FLOPs per scored candidate, request share amortized over
    ``candidates_per_request``, beside the FLOPs run once per request.

    Compare ``per_example`` with :func:`rankitect.space.flops` (every row computing everything).
    """
    cost = rocs_cost(arch, spec)
    return cost.per_example(candidates_per_request), cost.per_request


__all__ = [
    "RocsCost",
    "adapt",
    "model_rocs_cost",
    "request_rows",
    "request_sources",
    "rocs_cost",
    "rocs_flops",
    "score_requests",
    "split_logits",
]
