"""Standardized against raw dense inputs: the baselines' test NE, side by side, one run.

    PYTHONPATH=$PWD .venv/bin/python bench/dense_inputs.py                      # adult.csv and synthetic, 3 seeds
    PYTHONPATH=$PWD .venv/bin/python bench/dense_inputs.py --data adult --seeds 1 --models dcnv2

Every model standardizes its dense inputs with the training statistics its feature spec carries
(:class:`~rankitect.space.builder.DenseStandardizer`). "raw" trains the same baseline, seed and
protocol on the same cached data, with a spec whose statistics are the neutral ``mean=0, std=1``:
the inputs as the reader stored them (``log1p``), as models took them before. Prints per model
the mean and spread over seeds of test NE, and the validation NE after the first epoch.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = {
    "adult": [f"data.source={ROOT.parent / 'shared/data/adult.csv'}",
              f"data.schema={ROOT.parent / 'shared/data/adult.yaml'}"],
    "synthetic": ["data.source=synthetic", "data.rows=50000"],
}


class RawInputs:
    """``data`` with a spec whose dense statistics are neutral: models built on it standardize nothing."""

    def __init__(self, data: Any) -> None:
        self._data = data
        neutral = tuple(dataclasses.replace(f, mean=0.0, std=1.0) for f in data.spec.dense)
        self.spec = dataclasses.replace(data.spec, dense=neutral)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._data, name)


def main() -> None:
    from rankitect.config import load_config
    from rankitect.data import open_data
    from rankitect.space.baselines import get_baseline
    from rankitect.train.loop import train_architecture

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="adult,synthetic")
    parser.add_argument("--models", default="dlrm,dcnv2,deepfm,autoint,dhen")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.data.split(","):
        cfg = load_config(overrides=[*DATA[name], "train.progress=false"])
        data = open_data(cfg.data.source, cfg.data, progress=False)
        for model in args.models.split(","):
            arch = get_baseline(model, data.spec)
            for seed in range(args.seeds):
                train_cfg = dataclasses.replace(cfg.train, seed=seed)
                for inputs, d in (("standardized", data), ("raw", RawInputs(data))):
                    out = train_architecture(arch, d, train_cfg)
                    first = next(h["val/ne"] for h in out.history if "val/ne" in h)
                    rows.append({"data": name, "model": model, "inputs": inputs, "seed": seed,
                                 "test_ne": out.metrics["test/ne"], "val_ne_epoch1": first})
                    print(f"{name} {model} seed {seed} {inputs}: test NE {out.metrics['test/ne']:.4f}, "
                          f"validation NE after epoch 1 {first:.4f}", flush=True)
    df = pd.DataFrame(rows)
    table = df.groupby(["data", "model", "inputs"]).agg(
        test_ne=("test_ne", "mean"), sd=("test_ne", "std"), val_ne_epoch1=("val_ne_epoch1", "mean")).unstack("inputs")
    print(table.to_string(float_format=lambda v: f"{v:.4f}"))
    gain = 1 - table[("test_ne", "standardized")] / table[("test_ne", "raw")]
    print("\ntest NE gain of standardized inputs (relative):")
    print(gain.to_string(float_format=lambda v: f"{v:+.2%}"))


if __name__ == "__main__":
    main()
