"""ROCS serving: scoring throughput with and without request sharing, at 10 and 100 candidates.

    python -m bench.speed.rocs_bench                       # both specs, 1000 rows, 7 repetitions
    python -m bench.speed.rocs_bench --spec heavy --rows 2000 --reps 11 --threads 2
    python -m bench.speed.rocs_bench --spec synthetic --share 0.75  # every arch with rocs_share=0.75

For the six baselines made ROCS-masked (``rocs=True``) and ``--samples`` draws of the ``nasrec``
and ``engineer`` presets with ``rocs=True`` (and ``rocs_share=--share``, default ``None``: the
proportional share), on a Criteo-shaped spec (13 dense, 26 sparse, D = 16)
whose first features are request side:

* ``synthetic``: 4 dense and 8 sparse request-side features, the split of the embedded synthetic data;
* ``heavy``: 10 dense and 20 sparse request-side features (user and context features dominate, as
  in the production rankers ROCS was built for).

A batch holds ``--rows`` rows in requests of ``n`` candidates that share their request features.
Each repetition times ``model(batch)`` (every row computes everything) and
:func:`rankitect.serve.score_requests` (request part once per request) back to back, so the shared
machine's noise hits both alike; the table gives the median rows per second of each, their ratio
(``speedup``, goal >= 3 at 100 candidates), the FLOPs ratio from :func:`rankitect.space.flops` and
:func:`rankitect.serve.rocs_flops`, and the largest logit difference relative to the largest logit.

The numbers, with their commands: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np
import torch

from bench.common import parse_args
from rankitect.data.batch import Batch, make_batch
from rankitect.data.spec import DenseFeature, FeatureSpec, SparseFeature
from rankitect.serve import rocs_flops, score_requests
from rankitect.space import BASELINES, build_model, flops, get_baseline, get_space
from rankitect.space.architecture import Architecture

SPECS = {"synthetic": (4, 8), "heavy": (10, 20)}


def spec_with_requests(n_request_dense: int, n_request_sparse: int) -> FeatureSpec:
    """13 dense and 26 sparse features (vocabularies 10 .. 100 000), the first ones request side."""
    vocab = np.geomspace(10, 100_000, 26).astype(int)
    side = lambda i, r: "request" if i < r else "candidate"  # noqa: E731
    return FeatureSpec(
        dense=tuple(DenseFeature(f"i{i}", side(i, n_request_dense)) for i in range(13)),
        sparse=tuple(SparseFeature(f"c{i}", int(v), side(i, n_request_sparse)) for i, v in enumerate(vocab)),
        name=f"criteo_shaped_{n_request_dense}_{n_request_sparse}",
    )


def request_batch(spec: FeatureSpec, rows: int, candidates: int, rng: np.random.Generator) -> Batch:
    """``rows`` rows in requests of ``candidates`` rows; request-side features copied within a request."""
    request_ids = np.arange(rows) // candidates
    first = request_ids * candidates
    dense = rng.standard_normal((rows, spec.n_dense)).astype(np.float32)
    ids = np.stack([rng.integers(0, f.vocab_size, rows) for f in spec.sparse], axis=1)
    for j, f in enumerate(spec.dense):
        if f.side == "request":
            dense[:, j] = dense[first, j]
    for j, f in enumerate(spec.sparse):
        if f.side == "request":
            ids[:, j] = ids[first, j]
    return make_batch(dense, ids, np.zeros(rows), request_ids, keys=spec.sparse_names)


def architectures(spec: FeatureSpec, samples: int, seed: int, share: float | None) -> dict[str, Architecture]:
    """The baselines and preset draws, ROCS-masked with request share ``share`` (``None``: proportional)."""
    archs = {name: dataclasses.replace(get_baseline(name, spec), rocs=True) for name in BASELINES}
    rng = np.random.default_rng(seed)
    for space_name in ("nasrec", "engineer"):
        space = get_space(space_name, rocs=True)
        for i in range(samples):
            archs[f"{space_name}#{i}"] = space.decode(space.sample(rng))
    return {name: dataclasses.replace(arch, rocs_share=share) for name, arch in archs.items()}


def time_pair(model: torch.nn.Module, batch: Batch, reps: int) -> tuple[float, float, float]:
    """Median seconds of ``model(batch)`` and of ``score_requests``, and their max relative gap."""
    full_s, rocs_s = [], []
    with torch.inference_mode():
        ref, got = model(batch), score_requests(model, batch)  # warm-up, and the check
        gap = float((got - ref).abs().max() / ref.abs().max().clamp_min(1.0))
        for _ in range(reps):
            t0 = time.perf_counter()
            model(batch)
            t1 = time.perf_counter()
            score_requests(model, batch)
            t2 = time.perf_counter()
            full_s.append(t1 - t0)
            rocs_s.append(t2 - t1)
    return statistics.median(full_s), statistics.median(rocs_s), gap


def bench_spec(label: str, args: argparse.Namespace) -> None:
    spec = spec_with_requests(*SPECS[label])
    print(f"\n== spec {label}: {spec.n_request_dense}/{spec.n_dense} dense and "
          f"{spec.n_request_sparse}/{spec.n_sparse} sparse features request side; {args.rows} rows per batch; "
          f"rocs_share {args.share}")
    print(f"{'arch':12s} {'n':>4s} {'MFLOPs':>8s} {'ROCS MF':>8s} {'req MF':>8s} {'FLOPs x':>8s} "
          f"{'rows/s':>9s} {'ROCS rows/s':>11s} {'speedup':>8s} {'rel gap':>8s}")
    rng = np.random.default_rng(args.seed)
    for name, arch in architectures(spec, args.samples, args.seed, args.share).items():
        if args.arch and name not in args.arch:
            continue
        torch.manual_seed(args.seed)
        model = build_model(arch, spec).eval()
        full_flops = flops(arch, spec)
        for n in (10, 100):
            per_example, per_request = rocs_flops(arch, spec, n)
            batch = request_batch(spec, args.rows, n, rng)
            full_s, rocs_s, gap = time_pair(model, batch, args.reps)
            print(f"{name:12s} {n:4d} {full_flops / 1e6:8.3f} {per_example / 1e6:8.3f} {per_request / 1e6:8.3f} "
                  f"{full_flops / per_example:8.2f} {args.rows / full_s:9.0f} {args.rows / rocs_s:11.0f} "
                  f"{full_s / rocs_s:8.2f} {gap:8.1e}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", choices=[*SPECS, "both"], default="both")
    parser.add_argument("--rows", type=int, default=1000, help="rows per batch")
    parser.add_argument("--reps", type=int, default=7, help="interleaved repetitions (median)")
    parser.add_argument("--samples", type=int, default=2, help="rocs draws per preset")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--arch", action="append", help="only these architectures (repeatable), e.g. dlrm, nasrec#0")
    parser.add_argument("--share", type=float, default=None,
                        help="rocs_share of every architecture, in (0, 1) (default: proportional)")
    parser.add_argument("--seed", type=int, default=0)
    args = parse_args(parser, {"spec": "synthetic", "rows": 64, "reps": 1, "samples": 1}, argv)
    torch.set_num_threads(args.threads)
    for label in SPECS if args.spec == "both" else [args.spec]:
        bench_spec(label, args)


if __name__ == "__main__":
    main()
