"""Does the supernet rank the path DNAS found and its start path as retraining does?

    PYTHONPATH=$PWD .venv/bin/python bench/supernet_rank.py                       # adult.csv, from DCNv2
    PYTHONPATH=$PWD .venv/bin/python bench/supernet_rank.py --set estimator=gumbel --start dlrm
    PYTHONPATH=$PWD .venv/bin/python bench/supernet_rank.py --start autoint --set epochs=7 --buckets

One DNAS supernet phase (``dnas_search``) on the sized ``engineer`` space, starting around a
baseline's path, with the objective's target at that baseline's FLOPs. Then the path it found and
the start path are scored twice on the validation split: with the supernet's shared weights
(``evaluate_path``), and each retrained from scratch under the training protocol (``run_trial``).
Where the two orders disagree, the supernet's scores, which the architecture step follows, rank
wrongly. ``--buckets`` scores the start path with its dense features read as bucket fields too
(``dense.path: fields``, ``dense.fields: buckets``).
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
ADULT = [f"data.source={ROOT.parent / 'shared/data/adult.csv'}", f"data.schema={ROOT.parent / 'shared/data/adult.yaml'}"]


def main() -> None:
    from rankitect.config import load_config
    from rankitect.data import open_data
    from rankitect.search.dnas import dnas_search
    from rankitect.search.objective import Objective
    from rankitect.search.trial import run_trial
    from rankitect.space.baselines import get_baseline
    from rankitect.search.sizing import space_for
    from rankitect.supernet.train import build_supernet, evaluate_path

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--start", default="dcnv2", help="the baseline the search starts around")
    parser.add_argument("--set", action="append", default=["supernet_steps=400", "epochs=6"], metavar="KEY=VALUE",
                        help="a search.dnas setting (default: supernet_steps=400 epochs=6)")
    parser.add_argument("--data", action="append", default=None, metavar="KEY=VALUE",
                        help="data overrides (default: adult.csv with its schema)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--buckets", action="store_true", help="also the start path with bucket fields")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(overrides=[*(args.data or ADULT), f"data.cache_dir={tmp}", "train.progress=false"])
        data = open_data(cfg.data.source, cfg.data, progress=False)
        space = space_for("engineer", data.spec, "auto")
        supernet = build_supernet(space, data.spec, args.seed)
        start = space.encode(get_baseline(args.start, data.spec))
        if start is None:
            raise SystemExit(f"the sized engineer space does not hold {args.start}")
        settings = dict(s.split("=", 1) for s in args.set)
        dnas = dataclasses.replace(cfg.search.dnas, **{k: yaml.safe_load(v) for k, v in settings.items()})
        objective = Objective(target_mflops=supernet.path_flops(start) / 1e6, penalty="relaxed", weight=0.01)
        began = time.perf_counter()
        weights = dnas_search(supernet, data, cfg.train, dnas, objective, seed=args.seed, echo=print, start=start)
        print(f"supernet phase {time.perf_counter() - began:.1f} s, estimator {dnas.estimator}")
        val = list(data.split("val").batches(2048, shuffle=False))
        print(f"{'path':8s} {'hash':16s} {'MFLOPs':>7s} {'supernet val NE':>15s} {'AUC':>6s} {'calib':>6s} "
              f"{'retrained val NE':>16s} {'tAUC':>6s} {'retrained test NE':>17s}")
        paths = [("found", weights.argmax()), (args.start, start)]
        if args.buckets:
            paths.append(("+buckets", {**start, "dense.path": "fields", "dense.fields": "buckets"}))
        for name, path in paths:
            arch = space.decode(path)
            shared = evaluate_path(supernet, path, val)
            result = run_trial(arch, data, cfg.train).result
            print(f"{name:8s} {arch.hash:16s} {supernet.path_flops(path) / 1e6:7.3f} {shared['ne']:15.4f} "
                  f"{shared['auc']:6.4f} {shared['calibration']:6.3f} {result.val_ne:16.4f} "
                  f"{result.test_auc:6.4f} {result.test_ne:17.4f}")


if __name__ == "__main__":
    main()
