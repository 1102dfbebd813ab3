"""The DNAS phase alone on the cost bench's data, for one setting of ``search.dnas``, several seeds.

    PYTHONPATH=$PWD .venv/bin/python bench/dnas_lean.py 0,1,2 start_logit=2.0

Runs :func:`~rankitect.search.dnas.dnas_search` on the 100k-row, 10-field data of
:mod:`bench.nas_cost` (``epochs`` 2, the start DLRM and the FLOPs target AutoInt's 0.081 MFLOPs, as a
default search there resolves them), retrains the path it found and prints the supernet's seconds,
the path's MFLOPs, its training seconds, its validation and test NE, and the cost ratio
``1 + (supernet s + 0.75) / training s`` (0.75 s: building, saving and logging the supernet in a
real search). Settings are ``key=value`` of ``search.dnas``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from nas_cost import make_data  # beside this file
from rankitect.config import load_config
from rankitect.data import open_data
from rankitect.search.dnas import dnas_search
from rankitect.search.factory import objective_from_config
from rankitect.search.sizing import space_for
from rankitect.search.trial import run_trial
from rankitect.space.baselines import get_baseline
from rankitect.supernet.train import build_supernet


def main(seeds: list[int], settings: list[str]) -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(overrides=[f"data.source={make_data(Path(tmp) / 'data')}", "search.strategy=dnas",
                                     "train.progress=false", "runtime.threads=1"])
        data = open_data(cfg.data.source, cfg.data)
        space = space_for(cfg.search.space, data.spec, cfg.search.flops_range, rocs=False)
        objective = objective_from_config(cfg.search).with_target(0.0810)
        kw = {k: type(getattr(cfg.search.dnas, k))(v) for k, v in (s.split("=", 1) for s in settings)}
        dnas = replace(cfg.search.dnas, epochs=2.0, **kw)
        start = space.encode(get_baseline("dlrm", data.spec))
        ratios, tests = [], []
        for seed in seeds:
            supernet = build_supernet(space, data.spec, seed)
            said: list[str] = []
            t = time.perf_counter()
            weights = dnas_search(supernet, data, cfg.train, dnas, objective, seed=seed, echo=said.append, start=start)
            seconds = time.perf_counter() - t
            r = run_trial(space.decode(weights.argmax()), data, replace(cfg.train, progress=False)).result
            ratios.append(1 + (seconds + 0.75) / r.train_seconds)
            tests.append(r.test_ne)
            print(f"{kw} seed {seed}: supernet {seconds:.2f} s ({said[-1] if said else 'the schedule ran out'}), "
                  f"found {r.mflops:.3f} MFLOPs, training {r.train_seconds:.2f} s, ratio ~{ratios[-1]:.2f}, "
                  f"val NE {r.val_ne:.4f}, test NE {r.test_ne:.4f}", flush=True)
        print(f"{kw}: test NE {statistics.mean(tests):.4f}, ratio mean {statistics.mean(ratios):.2f}, "
              f"max {max(ratios):.2f}")


if __name__ == "__main__":
    main([int(s) for s in sys.argv[1].split(",")], sys.argv[2:])
