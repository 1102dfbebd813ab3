"""The cost of a default weight-sharing search on a 100k-row, 10-field data set (``python -m bench.speed.nas_bench --cost``).

Each strategy runs in a fresh process (its peak RSS is its own): a default ``rankitect search``
(the six baselines, the sized ``engineer`` space, ``target_mflops: auto``) on click data of
100 000 rows and 10 categorical fields, the phases timed one by one. The ratio is the weight-sharing
part of the search (supernet training and architecture choice, plus the retraining of what it
found) over one training of the architecture it found; the baselines, trained first by every
strategy alike, are timed on their own line.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from rankitect.data.spec import FeatureSpec, SparseFeature
from rankitect.data.store import StoreWriter

FIELDS, ROWS = 10, 100_000


def make_data(out: Path, seed: int = 0) -> Path:
    """``ROWS`` rows (80/10/10) of ``FIELDS`` Zipf-distributed categorical fields, vocabularies of
    5 to 1000 ids, labels from a logistic teacher with per-id effects and three pairwise terms."""
    rng = np.random.default_rng(seed)
    vocab = np.geomspace(5, 1000, FIELDS).astype(int)
    spec = FeatureSpec(dense=(), sparse=tuple(SparseFeature(f"c{i}", int(v)) for i, v in enumerate(vocab)),
                       name="cost-bench")
    effects = [rng.normal(0, 0.7, v) for v in vocab]
    pairs = [(0, 3), (2, 7), (5, 9)]
    tables = {p: rng.normal(0, 0.6, (vocab[p[0]], vocab[p[1]])) for p in pairs}
    rows = {"train": int(ROWS * 0.8), "val": ROWS // 10, "test": ROWS // 10}
    with StoreWriter(out, spec, rows, with_probs=True) as writer:
        for split, n in rows.items():
            ids = np.stack([np.minimum(rng.zipf(1.3, n), v - 1) for v in vocab], axis=1)
            logit = -1.2 + sum(e[ids[:, j]] for j, e in enumerate(effects))
            logit += sum(t[ids[:, a], ids[:, b]] for (a, b), t in tables.items())
            probs = 1 / (1 + np.exp(-logit))
            labels = (rng.random(n) < probs).astype(np.float32)
            writer.write(split, np.zeros((n, 0), np.float32), ids, labels, np.arange(n), probs.astype(np.float32))
        writer.close({"source": "nas_cost bench"})
    return out


def child(strategy: str, data_dir: str, threads: int, overrides: list[str] = ()) -> dict[str, Any]:
    """One default search of ``strategy`` in this process; its phases, ratio and peak RSS."""
    import torch

    from rankitect.config import load_config
    from rankitect.search.running.runner import SearchRunner

    torch.set_num_threads(threads)
    cfg = load_config(overrides=[f"data.source={data_dir}", f"search.strategy={strategy}", "train.progress=false",
                                 f"runtime.threads={threads}", *overrides])
    runner = SearchRunner(cfg, echo=lambda line: print("   ", line, flush=True))
    phases: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        def run(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - start
        return run

    runner._run_baselines = timed("baselines", runner._run_baselines)
    runner.strategy.search = timed("supernet", runner.strategy.search)
    runner._run_candidates = timed("retrain", runner._run_candidates)
    outcome = runner.run()
    cands = outcome.table[outcome.table["kind"] == "candidate"]
    found = cands.iloc[0]
    trained = [t for t in runner.state.candidates() if t.name == found["hash"]][0]
    one = trained.result.train_seconds
    from rankitect.supernet.memory import estimate_supernet_memory

    memory = estimate_supernet_memory(runner.space, runner.data.spec)
    return {"strategy": strategy, "phases": phases, "one_training_s": one, "found": found["hash"],
            "found_mflops": float(found["mflops"]), "found_test_ne": float(found["test_ne"]),
            "retrained": len(cands), "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
            "supernet_estimate_gb": memory.total / 1e9, "supernet_weights_m": (memory.dense_params
                                                                              + memory.embedding_params) / 1e6,
            "winner": outcome.table.loc[outcome.table["winner"], "name"].tolist()}


def cost_bench(strategies: list[str], threads: int, overrides: list[str] = ()) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = make_data(Path(tmp) / "data")
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlruns/mlflow.db", "PYTHONUNBUFFERED": "1"}
        results = []
        for strategy in strategies:
            print(f"{strategy}: a default search on {ROWS:,} rows x {FIELDS} fields, {threads} thread(s)"
                  + (f", with {list(overrides)}" if overrides else ""), flush=True)
            out = Path(tmp) / f"{strategy}.json"
            code = ("import json, sys; from bench.speed.nas_cost import child; "
                    f"json.dump(child({strategy!r}, {str(data)!r}, {threads}, {list(overrides)!r}), open({str(out)!r}, 'w'))")
            subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=Path(__file__).resolve().parents[1])
            results.append(json.loads(out.read_text()))
    goals = {"dnas": 3.0, "oneshot": 5.0}
    print(f"\n{'strategy':9s} {'baselines s':>11s} {'supernet s':>10s} {'retrain s':>9s} {'1 training s':>12s} "
          f"{'ratio':>6s} {'goal':>5s} {'peak RSS GB':>11s} {'est. GB':>8s}  found")
    for r in results:
        p = r["phases"]
        ratio = (p.get("supernet", 0.0) + p.get("retrain", 0.0)) / r["one_training_s"]
        print(f"{r['strategy']:9s} {p.get('baselines', 0):11.1f} {p.get('supernet', 0):10.1f} "
              f"{p.get('retrain', 0):9.1f} {r['one_training_s']:12.1f} {ratio:6.2f} {goals.get(r['strategy'], 0):5.1f} "
              f"{r['peak_rss_gb']:11.2f} {r['supernet_estimate_gb']:8.3f}  {r['found']} "
              f"({r['found_mflops']:.3f} MFLOPs, test NE {r['found_test_ne']:.4f}, {r['retrained']} retrained; "
              f"supernet {r['supernet_weights_m']:.1f}M weights; winner {r['winner']})")
