"""Does the supernet rank architectures as training them does? Kendall tau per data set and seed.

    python -m bench.quality.supernet_ranking --quick               # seconds: a smoke run
    python -m bench.quality.supernet_ranking                       # adult + synthetic, 3 seeds
    python -m bench.quality.supernet_ranking --data adult --seeds 0 --archs 20
    python -m bench.quality.supernet_ranking --data my_source --supernet oneshot

For each data set and seed: the sized ``engineer`` space; the architectures around the best
baseline (``--start auto``: every baseline the space holds is trained and the best by validation NE
is the start; or a baseline by name), the start plus ``--archs - 1`` distinct mutations of it (one
or two choices each); a supernet trained as the search trains it (``--supernet dnas``:
``dnas_search`` leaning towards the start; ``oneshot``: single uniform paths), and each
architecture scored on the validation split twice with the supernet's weights, as they are
(``evaluate_path``) and with the head fine-tuned first (``oneshot``'s ``ChildScorer``); each also
trained from scratch under the training protocol (``run_trial``). The table gives Kendall's tau-b
(:func:`rankitect.eval.ranking.kendall_tau`) between each supernet scoring and the stand-alone
validation NE: 1 ranks as training does, 0 no better than chance. A ``dnas`` phase also reads that
tau on 5 validation batches every ``search.dnas.ranking.every`` steps after its weights-only steps
(``--dnas ranking.every=N``): whether the supernet's ranking still improves when the phase stops.

``--data`` takes ``adult`` (``../shared/data/adult.csv`` with its schema), ``synthetic`` (the
default source) or any other ``data.source`` (a registered source name, a file, a cache folder).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import SHARED_DATA as SHARED
from bench.common import parse_args

QUICK = ["data.rows=6000", "train.max_epochs=2", "train.steps=60", "train.val_batches=4", "train.test_batches=2",
         "train.grace_steps=10", "train.batch_size=128"]
QUICK_DNAS = ["supernet.steps=40", "weights_only_steps=10", "supernet.epochs=1", "ranking.every=10"]


HISTORY_LENGTH = 20  # ``history``: the synthetic-categorical log with histories of up to this many items


def data_overrides(name: str) -> list[str]:
    """The ``data.*`` overrides of a data set named on the command line (adult, one of :data:`NAMED`,
    or a ``data.source``)."""
    if name == "adult":
        return [f"data.source={SHARED / 'adult.csv'}", f"data.schema={SHARED / 'adult.yaml'}"]
    if name in NAMED:
        return list(NAMED[name])
    return [f"data.source={name}"]


# Development data sets known by a name of their own (beside adult and the generators' names).
NAMED = {
    "rare": ("data.source=synthetic", "data.ctr=0.0064", "data.rows=100000"),  # a rare-click ad log: 0.64% clicks
    "history": ("data.source=synthetic-categorical", f"data.history={HISTORY_LENGTH}"),  # its planted history signal
}


def around(space: Any, start: Any, n: int, rng: np.random.Generator) -> list[Any]:
    """``start`` and ``n - 1`` distinct mutations of it (one or two choices each)."""
    archs, seen = [start], {start.hash}
    for _ in range(50 * n):
        if len(archs) == n:
            break
        child = space.mutate(start, rng, num_mutations=int(rng.integers(1, 3)))
        if child.hash not in seen:
            archs.append(child)
            seen.add(child.hash)
    return archs


def best_baseline(space: Any, data: Any, train_cfg: Any, name: str) -> tuple[Any, dict[str, float]]:
    """The start: baseline ``name``, or with ``auto`` the best by validation NE of those the space
    holds (each trained once); returns it and the stand-alone val NE of every one trained."""
    from rankitect.search.running.trial import run_trial
    from rankitect.space.baselines import BASELINES, get_baseline

    names = list(BASELINES) if name == "auto" else [name]
    held = [(n, get_baseline(n, data.spec)) for n in names]
    held = [(n, a) for n, a in held if space.contains(a)]
    if not held:
        raise SystemExit(f"the sized engineer space holds none of {names}")
    if name != "auto":
        return held[0][1], {}
    trained = {}
    for n, arch in held:
        result = run_trial(arch, data, train_cfg).result
        if result.ok:
            trained[arch.hash] = result.val_ne
            print(f"  baseline {n:8s} {arch.hash} val NE {result.val_ne:.4f}", flush=True)
    if not trained:
        raise SystemExit("no baseline the space holds trained")
    best = min((a for _, a in held if a.hash in trained), key=lambda a: trained[a.hash])
    return best, trained


def train_supernet_for(kind: str, space: Any, data: Any, cfg: Any, start: Any, seed: int,
                       archs: list[Any], standalone: list[float]) -> Any:
    """A supernet trained as the ``dnas`` (leaning towards ``start``) or ``oneshot`` search trains it.
    A ``dnas`` phase reads its tau against ``standalone`` every ``ranking.every`` steps and prints them."""
    from rankitect.supernet.dnas_phase import dnas_search
    from rankitect.eval.objective import Objective
    from rankitect.supernet.oneshot_phase import train_supernet
    from rankitect.supernet.rank_check import RankCheck
    from rankitect.supernet.train import build_supernet

    supernet = build_supernet(space, data.spec, seed)
    if kind == "dnas":
        dnas = cfg.search.dnas
        if dnas.supernet.epochs == "auto":
            dnas = dataclasses.replace(dnas, supernet=dataclasses.replace(dnas.supernet, epochs=1.0))
        val = [b for _, b in zip(range(5), data.split("val").batches(cfg.train.batch_size, shuffle=False))]
        truth = [ne if math.isfinite(ne) else None for ne in standalone]
        check = RankCheck(supernet, [space.encode(a) for a in archs], val, truth=truth)
        dnas_search(supernet, data, cfg.train, dnas, Objective(), seed=seed, start=space.encode(start),
                    rank_check=check, echo=lambda line: print(f"  {line}"))
        taus = " ".join(f"{r.tau_truth:.2f}" for r in check.readings)
        print(f"  tau against stand-alone every {dnas.ranking.every} steps after the weights-only steps: {taus}",
              flush=True)
    else:
        train_supernet(supernet, data, cfg.train, cfg.search.oneshot, seed=seed)
    return supernet


def one_run(cfg: Any, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Tau of one data set and seed, and the time each part took."""
    from rankitect.data import open_data
    from rankitect.eval.ranking import kendall_tau
    from rankitect.supernet.oneshot_phase import make_scorer
    from rankitect.search.proposing.sizing import space_for
    from rankitect.search.running.trial import run_trial
    from rankitect.supernet.train import evaluate_path

    train_cfg = dataclasses.replace(cfg.train, seed=seed)
    data = open_data(cfg.data.source, cfg.data, progress=False)
    space = space_for("engineer", data.spec, "auto")
    began = time.perf_counter()
    start, known = best_baseline(space, data, train_cfg, args.start)
    archs = around(space, start, args.archs, np.random.default_rng(seed))
    standalone = []
    for arch in archs:
        ne = known.get(arch.hash)
        if ne is None:
            result = run_trial(arch, data, train_cfg).result
            ne = result.val_ne if result.ok else math.nan
        standalone.append(ne)
        if args.verbose:
            print(f"    trained {arch.hash} val NE {ne:.4f} ({len(standalone)} of {len(archs)})", flush=True)
    trained_s = time.perf_counter() - began
    began = time.perf_counter()
    supernet = train_supernet_for(args.supernet, space, data, dataclasses.replace(cfg, train=train_cfg), start,
                                  seed, archs, standalone)
    supernet_s = time.perf_counter() - began
    val = list(data.split("val").batches(train_cfg.batch_size, shuffle=False))[: cfg.search.oneshot.score_batches]
    scorer = make_scorer(supernet, data, train_cfg, cfg.search.oneshot)
    shared = [evaluate_path(supernet, supernet.as_path(a), val)["ne"] for a in archs]
    tuned = [scorer(supernet.as_path(a))["ne"] for a in archs]
    keep = [i for i, ne in enumerate(standalone) if math.isfinite(ne)]

    def tau(scores: list[float]) -> float:
        ok = [i for i in keep if math.isfinite(scores[i])]
        return kendall_tau([scores[i] for i in ok], [standalone[i] for i in ok])

    if args.verbose:
        for a, s_ne, t_ne, ne in zip(archs, shared, tuned, standalone):
            print(f"    {a.hash} supernet {s_ne:.4f} fine-tuned head {t_ne:.4f} stand-alone {ne:.4f}")
    return {"n": len(keep), "start": start.hash, "tau_shared": tau(shared), "tau_tuned": tau(tuned),
            "supernet_s": supernet_s, "standalone_s": trained_s}


def main(argv: list[str] | None = None) -> None:
    from rankitect.config import load_config

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", nargs="+", default=["adult", "synthetic"],
                        help="data sets: adult, synthetic or any data.source (default: adult synthetic)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--archs", type=int, default=20, help="architectures around the start, itself included")
    parser.add_argument("--start", default="auto", help="auto (the best baseline the space holds) or a baseline name")
    parser.add_argument("--supernet", choices=["dnas", "oneshot"], default="dnas")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override (train.max_epochs=2, data.rows=50000, ...)")
    parser.add_argument("--dnas", action="append", default=[], metavar="KEY=VALUE",
                        help="a search.dnas setting (ranking.every=10: search.dnas.ranking.every=10)")
    parser.add_argument("--verbose", action="store_true", help="every architecture's three NEs")
    args = parse_args(parser, {"data": ["synthetic"], "seeds": [0], "archs": 6, "start": "dlrm"}, argv)
    overrides, dnas_items = list(args.set), list(args.dnas)
    if args.quick:  # a smoke run in seconds (6000 rows, short phases), not a measurement
        overrides, dnas_items = [*QUICK, *overrides], [*QUICK_DNAS, *dnas_items]
    overrides += [f"search.dnas.{item}" for item in dnas_items]
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.data:
            for seed in args.seeds:
                cfg = load_config(overrides=[*data_overrides(name), f"data.cache_dir={tmp}", "train.progress=false",
                                             *overrides])
                print(f"{name}, seed {seed}: {args.archs} architectures, {args.supernet} supernet", flush=True)
                rows.append({"data": name, "seed": seed, **one_run(cfg, args, seed)})
                r = rows[-1]
                print(f"  tau {r['tau_shared']:.3f} (supernet weights), {r['tau_tuned']:.3f} (head fine-tuned); "
                      f"n {r['n']}; supernet {r['supernet_s']:.0f} s, stand-alone {r['standalone_s']:.0f} s", flush=True)
    print(f"\n{'data':12s} {'seed':>4s} {'n':>3s} {'start':16s} {'tau shared':>10s} {'tau tuned':>9s}")
    for r in rows:
        print(f"{r['data'][:12]:12s} {r['seed']:4d} {r['n']:3d} {r['start']:16s} {r['tau_shared']:10.3f} "
              f"{r['tau_tuned']:9.3f}")
    for name in args.data:
        taus = [r["tau_shared"] for r in rows if r["data"] == name and math.isfinite(r["tau_shared"])]
        if len(taus) > 1:
            print(f"{name}: tau (supernet weights) {statistics.fmean(taus):.3f} +- {statistics.stdev(taus):.3f} "
                  f"over {len(taus)} seeds")


if __name__ == "__main__":
    main()
