"""Where bucket edges come from: one mini-batch, or 16,384 shuffled training rows, on adult.csv.

    PYTHONPATH=$PWD .venv/bin/python bench/bucket_edges.py      # 12 trainings, ~5 minutes on 2 cores

Trains two ``engineer`` architectures whose dense features enter as quantile-bucket fields (AutoInt
as the space encodes it, with ``dense.fields: buckets`` and ``dense.path`` ``fields`` or ``both``)
under the default protocol, seeds 0, 1 and 2, twice: with the edges set from ``EDGE_ROWS`` shuffled
training rows before the first step (:func:`rankitect.train.loop.set_bucket_edges`, what a training
does), and from the first mini-batch (that step left out: the block's own data-dependent init).
Prints test and validation NE, mean and spread over the seeds, side by side.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ADULT = [f"data.source={ROOT.parent / 'shared/data/adult.csv'}", f"data.schema={ROOT.parent / 'shared/data/adult.yaml'}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch

    import rankitect.train.loop as loop
    from rankitect.config import load_config
    from rankitect.data import open_data
    from rankitect.search.sizing import space_for
    from rankitect.space.baselines import get_baseline

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(overrides=[*ADULT, f"data.cache_dir={tmp}", "train.progress=false"])
        data = open_data(cfg.data.source, cfg.data, progress=False)
        space = space_for("engineer", data.spec, "auto")
        start = space.encode(get_baseline("autoint", data.spec))
        archs = {f"AutoInt, bucket fields, dense.path {path}": space.decode(
            {**start, "dense.path": path, "dense.fields": "buckets"}) for path in ("fields", "both")}
        whole = loop.set_bucket_edges
        print(f"{'model':42s} {'edges from':22s} {'test NE':>16s} {'val NE':>16s}")
        for name, arch in archs.items():
            for edges, setter in ((f"{loop.EDGE_ROWS:,} rows", whole), ("the first batch", lambda *a, **k: None)):
                loop.set_bucket_edges = setter
                test, val = [], []
                for seed in range(args.seeds):
                    metrics = loop.train_architecture(arch, data, dataclasses.replace(cfg.train, seed=seed)).metrics
                    test.append(metrics["test/ne"])
                    val.append(metrics["val/ne"])
                loop.set_bucket_edges = whole
                sd = (lambda xs: statistics.stdev(xs) if len(xs) > 1 else 0.0)
                print(f"{name:42s} {edges:22s} {statistics.mean(test):.4f} +- {sd(test):.4f} "
                      f"{statistics.mean(val):.4f} +- {sd(val):.4f}", flush=True)


if __name__ == "__main__":
    main()
