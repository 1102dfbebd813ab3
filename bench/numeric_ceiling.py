"""What limits a search on adult.csv: the model family, or how numeric features are encoded.

    PYTHONPATH=$PWD .venv/bin/python bench/numeric_ceiling.py                 # 3 seeds, ~10 minutes on 2 cores
    PYTHONPATH=$PWD .venv/bin/python bench/numeric_ceiling.py --seeds 1 --probe 0

Trains, with the default protocol (``train_architecture``, early stopping on validation NE), on
``../shared/data/adult.csv`` and 3 seeds each:

* **family**: AutoInt (the best baseline of every adult search) and hand-made neighbours of it at
  about its FLOPs or less: fewer layers, one head, ``D = 8`` or ``24``, a bottom MLP on the dense
  features, feed-forward sublayers. They are models the ``engineer`` space holds or could hold.
* **probe** (seed 0 only): ``--probe`` architectures drawn from the sized ``engineer`` space around
  AutoInt (chains of 1 to 3 mutations, as evolution draws them) at no more than its FLOPs; the best
  test NE among them is an oracle's pick (chosen on test), an upper bound for any strategy.
* **numeric encoding**: the same attention layers where each dense feature enters as a field of its
  own, encoded (a) by learned periodic features ``ReLU(W_j [sin 2πc_j x, cos 2πc_j x])`` per feature
  (Gorishniy et al., NeurIPS'22, arXiv 2203.05556, "PLR"; a block defined in this script), or (b) as
  quantile buckets: a derived copy of the CSV where every dense column also has a categorical column
  of its 16 quantile buckets (over the whole file; nonzero values only for the mostly-zero
  ``capital_*``; no label is read), embedded like any categorical feature.

Prints per model the mean and spread over seeds of test and validation NE, the test NE relative to
AutoInt's, and MFLOPs. Neither encoding is part of the spaces or the data path: this script only
measures where the headroom on this data set is.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
ADULT = ROOT.parent / "shared/data/adult.csv"
SCHEMA = ROOT.parent / "shared/data/adult.yaml"
BUCKETS = 16


def register_periodic() -> None:
    """Register the ``periodic_bench`` block (FLAT ``(B, n)`` -> FIELD ``(B, n, D)``), once per process."""
    from rankitect.blocks.base import BLOCKS, FIELD, FLAT, Block, register_block

    if "periodic_bench" in BLOCKS:
        return

    @register_block("periodic_bench")
    class Periodic(Block):
        in_kind, out_kind, num_inputs, mixes_fields = FLAT, FIELD, 1, False

        def __init__(self, in_features: int, *, dim: int = 16, frequencies: int = 8, sigma: float = 1.0,
                     request_in: int | None = None) -> None:
            super().__init__()
            self.n, self.k, self.d = in_features, frequencies, dim
            self.c = nn.Parameter(torch.randn(in_features, frequencies) * sigma)
            self.w = nn.Parameter(torch.randn(in_features, 2 * frequencies, dim) / math.sqrt(2 * frequencies))
            self.b = nn.Parameter(torch.zeros(in_features, dim))
            self.out_shape, self.request_out = (in_features, dim), 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            v = 2 * math.pi * x.unsqueeze(-1) * self.c  # (B, n, k)
            v = torch.cat([torch.sin(v), torch.cos(v)], -1)  # (B, n, 2k)
            return torch.relu(torch.einsum("bnk,nkd->bnd", v, self.w) + self.b)  # (B, n, D)

        def flops(self) -> int:
            return self.n * 2 * self.k * self.d * 2


def bucketed_copy(out_dir: Path) -> tuple[Path, Path]:
    """adult.csv with a quantile-bucket categorical column per dense column, and its schema."""
    import yaml

    df = pd.read_csv(ADULT)
    schema = yaml.safe_load(SCHEMA.read_text())
    for col in schema["dense"]:
        x = df[col]
        mostly_zero = (x == 0).mean() > 0.5
        part = x[x != 0] if mostly_zero else x
        codes = pd.qcut(part.rank(method="first"), BUCKETS, labels=False).astype(int).astype(str)
        df[f"{col}_bucket"] = codes.reindex(df.index).fillna("zero")
    schema["sparse"] = [*schema["sparse"], *(f"{c}_bucket" for c in schema["dense"])]
    schema["name"] = "adult_buckets"
    csv, yml = out_dir / "adult_buckets.csv", out_dir / "adult_buckets.yaml"
    df.to_csv(csv, index=False)
    yml.write_text(yaml.safe_dump(schema))
    return csv, yml


def overrides(source: Path, schema: Path, cache: str, seed: int) -> list[str]:
    return [f"data.source={source}", f"data.schema={schema}", f"data.cache_dir={cache}", f"train.seed={seed}",
            f"search.seed={seed}", "train.progress=false"]


def models(spec: Any, bucketed: bool) -> dict[str, Any]:
    """Name -> architecture for ``spec`` (the bucketed copy's spec when ``bucketed``)."""
    from rankitect.space.architecture import Architecture, BlockGene, HeadGene
    from rankitect.space.baselines import get_baseline

    def att(inputs: tuple, heads: int = 2, ffn: bool = False, **kw: Any) -> BlockGene:
        return BlockGene("attention", inputs, {"num_heads": heads, "ffn": ffn}, **kw)

    def stack(first: tuple, layers: int, head: tuple = (), pre: tuple = (), heads: int = 2, ffn: bool = False,
              dim: int = 16, tokens: int | None = None) -> Architecture:
        kw = {"tokens": tokens} if tokens else {}
        genes = [*pre, att(first, heads, ffn, **kw)]
        for _ in range(layers - 1):
            genes.append(att((len(genes) - 1,), heads, ffn))
        return Architecture(tuple(genes), HeadGene((len(genes) - 1,), head), dim)

    raw = ("sparse", "dense")
    if bucketed:
        return {"buckets: attention x1": stack(raw, 1, tokens=1),
                "buckets: attention x2": stack(raw, 2, tokens=1)}
    periodic = BlockGene("periodic_bench", ("dense",), {})
    return {
        "autoint": get_baseline("autoint", spec),
        "attention x2": stack(raw, 2, tokens=1),
        "attention x2, top 32": stack(raw, 2, (32,), tokens=1),
        "autoint, 1 head": stack(raw, 3, heads=1, tokens=1),
        "autoint, D=8": get_baseline("autoint", spec, embedding_dim=8),
        "autoint, D=24": get_baseline("autoint", spec, embedding_dim=24),
        "autoint, bottom MLP 32": stack(("sparse", 0), 3, pre=(BlockGene("mlp", ("dense",), {"width": 32}),),
                                        tokens=1),
        "attention+FFN x2": stack(raw, 2, ffn=True, tokens=1),
        "periodic: attention x1": stack(("sparse", 0), 1, pre=(periodic,)),
        "periodic: attention x2": stack(("sparse", 0), 2, pre=(periodic,)),
    }


def probe_archs(spec: Any, n: int) -> list[Any]:
    """``n`` distinct architectures of the sized ``engineer`` space within AutoInt's FLOPs, drawn around
    AutoInt by chains of 1 to 3 mutations (a parent is AutoInt or an earlier draw, half and half)."""
    import numpy as np

    from rankitect.search.sizing import space_for
    from rankitect.space.baselines import get_baseline
    from rankitect.space.flops import flops

    space = space_for("engineer", spec, "auto")
    autoint = get_baseline("autoint", spec)
    cap, rng, out = flops(autoint, spec), np.random.default_rng(0), []
    while len(out) < n:
        parent = out[int(rng.integers(len(out)))] if out and rng.random() < 0.5 else autoint
        arch = space.mutate(parent, rng, int(rng.integers(1, 4)))
        if flops(arch, spec) <= cap and arch != autoint and arch not in out:
            out.append(arch)
    return out


def train_one(task: tuple[str, str, int, str, str, str]) -> dict[str, Any]:
    """Train one model of ``models``/``probe_archs`` (named by ``kind``/``name``) on one seed."""
    kind, name, seed, source, schema, cache = task
    torch.set_num_threads(1)
    register_periodic()
    from rankitect.config import load_config
    from rankitect.data import open_data
    from rankitect.space.flops import flops
    from rankitect.train.loop import train_architecture

    cfg = load_config(overrides=overrides(Path(source), Path(schema), cache, seed))
    data = open_data(cfg.data.source, cfg.data, progress=False)
    if kind == "probe":
        arch = probe_archs(data.spec, int(name.split()[-1]) + 1)[-1]
    else:
        arch = models(data.spec, kind == "buckets")[name]
    result = train_architecture(arch, data, replace(cfg.train, progress=False))
    return {"kind": kind, "model": name, "seed": seed, "test_ne": result.metrics["test/ne"],
            "val_ne": result.metrics["val/ne"], "mflops": flops(arch, data.spec) / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--probe", type=int, default=24, help="engineer-space draws within AutoInt's FLOPs (seed 0)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args()

    from rankitect.config import load_config
    from rankitect.data import open_data

    register_periodic()
    with tempfile.TemporaryDirectory() as tmp:
        cache = str(Path(tmp) / "cache")
        b_csv, b_yml = bucketed_copy(Path(tmp))
        tasks = []
        for source, schema, kind in ((ADULT, SCHEMA, "family"), (b_csv, b_yml, "buckets")):
            cfg = load_config(overrides=overrides(source, schema, cache, 0))
            spec = open_data(cfg.data.source, cfg.data, progress=False).spec  # cache once, before the workers
            names = models(spec, kind == "buckets")
            tasks += [(kind, n, s, str(source), str(schema), cache) for s in range(args.seeds) for n in names]
        tasks += [("probe", f"draw {i}", 0, str(ADULT), str(SCHEMA), cache) for i in range(args.probe)]
        with mp.get_context("spawn").Pool(args.jobs) as pool:
            rows = []
            for row in pool.imap_unordered(train_one, tasks):
                print(f"  {row['model']:<26} seed {row['seed']}: test NE {row['test_ne']:.4f}  "
                      f"val NE {row['val_ne']:.4f}  {row['mflops']:.4f} MFLOPs", flush=True)
                rows.append(row)
    df = pd.DataFrame(rows)
    ref = df[df.model == "autoint"].test_ne.mean()
    cap = df[df.model == "autoint"].mflops.max()
    main_rows = df[df.kind != "probe"]
    table = main_rows.groupby("model", sort=False).agg(
        test_ne=("test_ne", "mean"), test_sd=("test_ne", "std"), val_ne=("val_ne", "mean"),
        val_sd=("val_ne", "std"), mflops=("mflops", "first"), seeds=("seed", "count"))
    table["vs_autoint_%"] = 100 * (table.test_ne / ref - 1)
    print(table.sort_values("test_ne").round(4).to_string())
    probe = df[df.kind == "probe"]
    if len(probe):
        best = probe.loc[probe.test_ne.idxmin()]
        seed0 = df[(df.model == "autoint") & (df.seed == 0)].test_ne.iloc[0]
        print(f"\nprobe: {len(probe)} engineer-space draws within autoint's {cap:.4f} MFLOPs, seed 0: best test NE "
              f"{best.test_ne:.4f} ({best.model}, {best.mflops:.4f} MFLOPs; picked on test), autoint {seed0:.4f} "
              f"({100 * (best.test_ne / seed0 - 1):+.2f}%); median {probe.test_ne.median():.4f}")


if __name__ == "__main__":
    main()
