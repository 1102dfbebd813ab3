"""Histories measured: on the history log, each baseline and the default ``dnas`` search against the
best history-free baseline, by validation NE and its paired standard error.

    python -m bench.quality.quality_bench --data history --strategies dnas --ranking-archs 0 \\
        --set runtime.threads=1 --out quality          # the searches (3 seeds), one at a time
    python -m bench.quality.history_report --out quality      # this table

The history log is ``synthetic-categorical`` with ``data.history=20`` (each request's history of up
to 20 earlier items, a per-request session interest that only the history reveals; see
:mod:`rankitect.data.synthetic_history`). Per seed, the search folder under
``--out/runs/history-s<seed>-dnas`` holds its Pareto table and the per-example validation losses of
every trained model. The reference is the best *history-free* baseline (DLRM, DCNv2, DeepFM, AutoInt,
Wukong, DHEN: the lowest validation NE); each other model's gain is the paired difference of
validation losses, ``mean(l_ref - l_model) / H``, divided by its standard error
(:func:`~rankitect.search.judging.selection.paired_gain`, the search's own winner rule's): ``z > 3``
is a model using history that beats every history-free baseline by more than 3 standard errors.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.common import parse_args
from rankitect.search.judging.selection import paired_gain
from rankitect.search.judging.standings import ExampleLosses
from rankitect.space.baselines import BASELINES, HISTORY_BASELINES
from rankitect.space.history_choices import HISTORY_OPS as OPS

HISTORY_OPS = {op for op in OPS.values() if op is not None}


def read_seed(folder: Path) -> list[dict[str, Any]]:
    """Rows of one search: each ok baseline, the returned model and the best history candidate,
    with its paired gain over the best history-free baseline (``gain``, ``se``, ``z``)."""
    tables = sorted(folder.glob("*/pareto.csv"))
    if len(tables) != 1:
        raise SystemExit(f"{folder}: expected one search's pareto.csv, found {len(tables)}")
    table = pd.read_csv(tables[0]).to_dict(orient="records")
    trials = json.loads((tables[0].parent / "state.json").read_text())["trials"]
    reads = {t["name"]: "+".join(b["op"] for b in t["arch"]["blocks"] if b["op"] in HISTORY_OPS) or "-"
             for t in trials}
    losses = ExampleLosses(tables[0].parent)
    ok = [r for r in table if r["status"] == "ok" and not pd.isna(r["val_ne"])]
    free = [r for r in ok if r["kind"] == "baseline" and r["name"] in BASELINES]
    ref = min(free, key=lambda r: r["val_ne"])
    ref_losses = losses.load(ref["name"])
    entropy = float(np.mean(ref_losses, dtype=np.float64)) / ref["val_ne"]
    rows = []
    for r in ok:
        role = "winner" if r["winner"] in (True, "True") else r["kind"]
        if r["kind"] == "candidate" and role != "winner":
            continue
        row = {"name": r["name"], "role": role, "val_ne": r["val_ne"], "test_ne": r["test_ne"], "mflops": r["mflops"],
               "reference": r["name"] == ref["name"], "history": reads.get(r["name"], "?")}
        mine = losses.load(r["name"])
        if mine is not None and r["name"] != ref["name"]:
            gain, se = paired_gain(ref_losses, mine, entropy=entropy)
            row.update(gain=gain, se=se, z=gain / se if se > 0 else float("nan"))
        rows.append(row)
    return rows


def _f(v: Any, spec: str = ".4f") -> str:
    return "-" if v is None or (isinstance(v, float) and np.isnan(v)) else format(v, spec)


def show(seeds: dict[int, list[dict[str, Any]]]) -> None:
    """Per seed every model's val/test NE and z against the reference; then the means over seeds."""
    print("| seed | model | role | history block | val NE | test NE | MFLOPs | gain over best history-free (val NE) | z |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seed, rows in seeds.items():
        for r in sorted(rows, key=lambda r: r["val_ne"]):
            name = f"**{r['name']}** (ref)" if r["reference"] else r["name"]
            print(f"| {seed} | {name} | {r['role']} | {r['history']} | {_f(r['val_ne'])} | {_f(r['test_ne'])} "
                  f"| {_f(r['mflops'], '.3f')} | {_f(r.get('gain'))} +- {_f(r.get('se'))} | {_f(r.get('z'), '.1f')} |")
    print("\n| model | seeds | mean val NE | mean test NE | min z | mean z |")
    print("|---|---|---|---|---|---|")
    names = [*BASELINES, *HISTORY_BASELINES, "winner"]
    for name in names:
        picked = [r for rows in seeds.values() for r in rows
                  if (r["role"] == "winner" if name == "winner" else r["name"] == name and r["role"] == "baseline")]
        if not picked:
            continue
        zs = [r["z"] for r in picked if r.get("z") is not None]
        label = "dnas returned" if name == "winner" else name
        print(f"| {label} | {len(picked)} | {_f(statistics.mean(r['val_ne'] for r in picked))} | "
              f"{_f(statistics.mean(r['test_ne'] for r in picked))} | {_f(min(zs) if zs else None, '.1f')} | "
              f"{_f(statistics.mean(zs) if zs else None, '.1f')} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="quality", help="the quality bench's --out")
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",") if x], default=[0, 1, 2])
    parser.add_argument("--data", default="history", help="the data label of the searches")
    args = parse_args(parser, {"seeds": [0]}, argv)
    seeds = {}
    for seed in args.seeds:
        folder = Path(args.out) / "runs" / f"{args.data}-s{seed}-dnas" / "searches"
        if folder.is_dir():
            seeds[seed] = read_seed(folder)
        else:
            print(f"seed {seed}: no search under {folder}")
    show(seeds)


if __name__ == "__main__":
    main()
