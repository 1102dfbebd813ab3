"""ROCS serving of history models: rows per second with the history encoded once per request.

    python -m bench.speed.history_rocs_bench                  # L = 50, 2000 rows, 10 and 100 candidates
    python -m bench.speed.history_rocs_bench --max-len 100 --rows 4000 --reps 11 --threads 2

On the all-categorical spec (6 request-side and 4 candidate-side sparse features, D = 16) with a
history of ``--max-len`` items sharing the candidate item's table, four ROCS-masked models read the
history, each as the DIN and BST baselines are built (the embeddings and the history block's output
into a top MLP 512-256-1): ``dca`` (ROCS Deep Cross Attention, 2 heads, with its encoder), ``din``,
``bst`` and ``pool``. A batch holds ``--rows`` rows in requests of ``n`` candidates sharing their
request features and history (lengths 0 to ``max_len``). Each repetition times ``model(batch)``
(per-row scoring: every row encodes its request's history) and
:func:`rankitect.serve.score_requests` (the history looked up, encoded and, for DCA, its keys and
values computed once per request; each candidate forms its query) back to back on the same model, so
the shared machine's noise hits both alike. The table gives the median rows per second of each,
their ratio (``speedup``; goal for ``dca`` >= 3 at 100 candidates), the FLOPs ratio and the largest
logit difference relative to the largest logit.

The numbers, with their commands: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import torch

from bench.common import parse_args
from bench.speed.rocs_bench import time_pair
from rankitect.data.batch import Batch, make_batch
from rankitect.data.spec import FeatureSpec, SequenceFeature, SparseFeature
from rankitect.data.synthetic_categorical import FIELDS, ITEMS
from rankitect.serve import rocs_flops
from rankitect.space import build_model, flops
from rankitect.space.architecture import Architecture, BlockGene, HeadGene
from rankitect.space.baselines import bst, din

HISTORY = "item_history"


def history_spec(max_len: int) -> FeatureSpec:
    """The all-categorical spec with a history of ``max_len`` items sharing ``item_id``'s table."""
    return FeatureSpec(dense=(), sparse=tuple(SparseFeature(name, n + 1, side) for name, side, n in FIELDS),
                       sequence=(SequenceFeature(HISTORY, max_len, ITEMS + 1, shares="item_id"),),
                       name="categorical_history")


def architectures(spec: FeatureSpec) -> dict[str, Architecture]:
    """DCA, DIN, BST and pooling, each into a top MLP 512-256-1 beside the embeddings, ROCS-masked."""
    def top(op: str, params: dict) -> Architecture:
        gene = BlockGene(op, (f"history:{HISTORY}",), params)
        return Architecture((gene,), HeadGene(("sparse", 0), (512, 256)), 16, rocs=True)

    return {"dca": top("history_cross", {"num_heads": 2, "encoder": True}),
            "din": dataclasses.replace(din(spec), rocs=True), "bst": dataclasses.replace(bst(spec), rocs=True),
            "pool": top("history_pool", {"mode": "mean"})}


def request_batch(spec: FeatureSpec, rows: int, candidates: int, rng: np.random.Generator) -> Batch:
    """``rows`` rows in requests of ``candidates``; request features and history copied within a request."""
    request_ids = np.arange(rows) // candidates
    first = request_ids * candidates
    ids = np.stack([rng.integers(1, f.vocab_size, rows) for f in spec.sparse], axis=1)
    for j, f in enumerate(spec.sparse):
        if f.side == "request":
            ids[:, j] = ids[first, j]
    L = spec.sequence[0].max_len
    lengths = rng.integers(0, L + 1, rows)[first]
    history = rng.integers(1, ITEMS + 1, (rows, L))[first]
    history[np.arange(L) < (L - lengths)[:, None]] = 0  # pads first
    return make_batch(np.zeros((rows, 0)), ids, np.zeros(rows), request_ids, keys=spec.sparse_names,
                      history={HISTORY: (history, lengths)})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-len", type=int, default=50, help="history length L")
    parser.add_argument("--rows", type=int, default=2000, help="rows per batch")
    parser.add_argument("--reps", type=int, default=7, help="interleaved repetitions (median)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--arch", action="append", help="only these (repeatable): dca, din, bst, pool")
    parser.add_argument("--seed", type=int, default=0)
    args = parse_args(parser, {"rows": 200, "reps": 1, "max_len": 8}, argv)
    torch.set_num_threads(args.threads)
    spec = history_spec(args.max_len)
    print(f"history of {args.max_len} items, {spec.n_request_sparse}/{spec.n_sparse} sparse features request side, "
          f"{args.rows} rows per batch, {args.threads} thread(s)")
    print(f"{'arch':6s} {'n':>4s} {'MFLOPs':>8s} {'ROCS MF':>8s} {'FLOPs x':>8s} {'rows/s':>9s} {'ROCS rows/s':>11s} "
          f"{'speedup':>8s} {'rel gap':>8s}")
    rng = np.random.default_rng(args.seed)
    for name, arch in architectures(spec).items():
        if args.arch and name not in args.arch:
            continue
        torch.manual_seed(args.seed)
        model = build_model(arch, spec).eval()
        full = flops(arch, spec)
        for n in (10, 100):
            per_example, _ = rocs_flops(arch, spec, n)
            full_s, rocs_s, gap = time_pair(model, request_batch(spec, args.rows, n, rng), args.reps)
            print(f"{name:6s} {n:4d} {full / 1e6:8.3f} {per_example / 1e6:8.3f} {full / per_example:8.2f} "
                  f"{args.rows / full_s:9.0f} {args.rows / rocs_s:11.0f} {full_s / rocs_s:8.2f} {gap:8.1e}")


if __name__ == "__main__":
    main()
