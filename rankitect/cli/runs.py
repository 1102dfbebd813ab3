"""``rankitect runs [RUN]``: the searches of the run store, or the candidates of one search by test NE.

The table is as wide as the terminal: columns that do not fit are left out, the least telling
first (the run id and name of each run stay, as they are what other commands take). The search's
winner (what ``export`` and the logged model hold) is marked ``*``; a trial's status is its own
(``ok``, ``pruned`` when the search stopped it early, ``failed``).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from rankitect.cli.arguments import add_config_args
from rankitect.cli.tracked import open_tracker
from rankitect.config import Config
from rankitect.track.names import (GENOTYPE_HASH, MFLOPS, PARAMS, TEST_AUC, TEST_LOGLOSS, TEST_NE, TRAIN_SECONDS,
                                   VAL_NE)

# Columns by how much they tell, most first; those at the end are left out first when narrow.
SEARCH_COLUMNS = ("run_id", "name", "data", "winner", TEST_NE, "status", MFLOPS, "start_time", "strategy", "space")
TRIAL_COLUMNS = ("name", "kind", "status", "winner", VAL_NE, TEST_NE, MFLOPS, "run_id", TEST_AUC, PARAMS,
                 TRAIN_SECONDS, TEST_LOGLOSS, GENOTYPE_HASH)
MIN_COLUMNS = 2  # never fewer than the run id and the name


def add_commands(sub: Any) -> None:
    runs = sub.add_parser("runs", help="list searches, or the candidates of one search by NE")
    runs.add_argument("run_id", nargs="?", help="a search's MLflow run id")
    add_config_args(runs)
    runs.set_defaults(handler=cmd_runs, flags={})


def cmd_runs(args: argparse.Namespace, cfg: Config) -> int:
    tracker = open_tracker(cfg)
    table = tracker.runs_table(args.run_id) if args.run_id else tracker.searches_table()
    if not len(table):
        print("no runs" + (f" under {args.run_id}" if args.run_id else "") + f" in {tracker.uri}")
        return 0
    print(render(table, SEARCH_COLUMNS if args.run_id is None else TRIAL_COLUMNS,
                 shutil.get_terminal_size((100, 24)).columns))
    return 0


def render(table: Any, columns: tuple[str, ...], width: int) -> str:
    """``table``'s ``columns`` (those it has) as text of at most ``width`` characters a line where
    dropping the last columns can make it so: the winner as ``*``, NEs to 4 decimals, a data
    source by its file name."""
    shown = table[[c for c in columns if c in table]].copy()
    if "winner" in shown:
        if shown["winner"].dtype == bool:
            shown["winner"] = shown["winner"].map({True: "*", False: ""})
        else:  # a search's winner: its name
            shown["winner"] = shown["winner"].fillna("")
    if "data" in shown:
        shown["data"] = shown["data"].map(lambda s: Path(str(s).rstrip("/")).name if isinstance(s, str) else "")
    for col in shown.columns:
        if col == PARAMS:
            shown[col] = shown[col].map(lambda v: "" if v != v else f"{int(v):,}")
        elif col == TRAIN_SECONDS:
            shown[col] = shown[col].map(lambda v: "" if v != v else f"{v:.1f}")
        elif shown[col].dtype.kind == "f":
            shown[col] = shown[col].map(lambda v: "" if v != v else f"{v:.4f}")
    while True:
        text = shown.to_string(index=False)
        over = max(map(len, text.splitlines())) - width
        if over <= 0:
            return text
        if len(shown.columns) > MIN_COLUMNS:
            shown = shown.drop(columns=shown.columns[-1])
            continue
        # the run id and the name left: the name is cut (its end is the start time, also a column)
        name = [c for c in shown.columns if c != "run_id"][-1]
        keep = max(8, int(shown[name].astype(str).str.len().max()) - over)
        if keep >= shown[name].astype(str).str.len().max():
            return text
        shown[name] = shown[name].astype(str).map(lambda v: v if len(v) <= keep else v[:keep - 1] + "~")
