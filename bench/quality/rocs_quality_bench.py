"""What ROCS masking costs in quality: test NE of baselines unmasked and ROCS-masked at request shares.

    python -m bench.quality.rocs_quality_bench                       # dlrm and deepfm, 300 steps
    python -m bench.quality.rocs_quality_bench --arch wukong --steps 600 --shares none,0.75

Each architecture is trained with the default training config (same seed, same batches) on the
default synthetic data: unmasked, then with ``rocs=True`` at every ``--shares`` value (``none`` is the
proportional share). The table gives test and validation NE beside the MFLOPs per example a search
ranks it by (request-shared for ROCS, at the data's candidates per request): the trade a ROCS search
weighs. One seed: differences below ~0.002 NE are within seed noise at this budget.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from bench.common import parse_args
from rankitect.config import TrainConfig
from rankitect.cost import measure
from rankitect.data import open_data
from rankitect.search.running.trial import candidates_per_request
from rankitect.space import get_baseline
from rankitect.train.loop import train_architecture


def parse_shares(text: str) -> list[float | None]:
    return [None if s.strip().lower() == "none" else float(s) for s in text.split(",")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", action="append", help="baseline name (repeatable); default dlrm and deepfm")
    parser.add_argument("--steps", type=int, default=TrainConfig().steps)
    parser.add_argument("--shares", default="none,0.5,0.9", help="comma-separated rocs_share values")
    parser.add_argument("--rows", type=int, default=0, help="synthetic rows (0: the default data.rows)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parse_args(parser, {"arch": ["dlrm"], "steps": 5, "shares": "none", "rows": 3000}, argv)
    torch.set_num_threads(args.threads)
    data = open_data("synthetic", rows=args.rows or None, progress=True)
    cfg = dataclasses.replace(TrainConfig(), steps=args.steps, progress=False)
    print(f"{'arch':8s} {'masking':14s} {'test/ne':>8s} {'val/ne':>8s} {'MFLOPs':>8s}")
    for name in args.arch or ["dlrm", "deepfm"]:
        base = get_baseline(name, data.spec)
        variants = [("unmasked", base)]
        variants += [(f"rocs {s or 'prop.'}", dataclasses.replace(base, rocs=True, rocs_share=s))
                     for s in parse_shares(args.shares)]
        for label, arch in variants:
            metrics = train_architecture(arch, data, cfg).metrics
            mflops = measure(arch, data.spec, candidates_per_request(data) if arch.rocs else None).served_mflops
            print(f"{name:8s} {label:14s} {metrics['test/ne']:8.4f} {metrics['val/ne']:8.4f} {mflops:8.3f}", flush=True)


if __name__ == "__main__":
    main()
