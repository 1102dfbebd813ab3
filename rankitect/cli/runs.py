"""``rankitect runs [RUN]``: the searches of the run store, or the candidates of one search by test NE."""

from __future__ import annotations

import argparse
from typing import Any

from rankitect.cli.arguments import add_config_args
from rankitect.cli.tracked import open_tracker
from rankitect.config import Config


def add_commands(sub: Any) -> None:
    runs = sub.add_parser("runs", help="list searches, or the candidates of one search by NE")
    runs.add_argument("run_id", nargs="?", help="a search's MLflow run id")
    add_config_args(runs)
    runs.set_defaults(handler=cmd_runs, flags={})


def cmd_runs(args: argparse.Namespace, cfg: Config) -> int:
    import pandas as pd

    tracker = open_tracker(cfg)
    table = tracker.runs_table(args.run_id) if args.run_id else tracker.searches_table()
    if not len(table):
        print("no runs" + (f" under {args.run_id}" if args.run_id else "") + f" in {tracker.uri}")
        return 0
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.drop(columns=[c for c in ("parent_id", "error") if c in table]).to_string(index=False))
    return 0
