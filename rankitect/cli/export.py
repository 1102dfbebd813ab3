"""``rankitect export RUN -o DIR``: a tracked model as a standalone ``model.py`` plus its weights."""

from __future__ import annotations

import argparse
from typing import Any

from rankitect.cli.arguments import add_config_args
from rankitect.cli.tracked import data_of_run, open_tracker
from rankitect.config import Config


def add_commands(sub: Any) -> None:
    export = sub.add_parser("export", help="write a tracked model as a standalone model.py + weights")
    export.add_argument("run_id", help="a candidate's or baseline's run id, or a search run (its winner)")
    export.add_argument("-o", "--output", required=True, help="output directory")
    add_config_args(export)
    export.set_defaults(handler=cmd_export, flags={})


def cmd_export(args: argparse.Namespace, cfg: Config) -> int:
    import tempfile

    from rankitect.data import open_data
    from rankitect.export import export_from_files

    tracker = open_tracker(cfg)
    data_cfg = data_of_run(args, cfg, tracker, args.run_id, "export")
    data = open_data(data_cfg.source, data_cfg, progress=True)
    with tempfile.TemporaryDirectory() as tmp:
        files = tracker.fetch_model_files(args.run_id, tmp)
        out = export_from_files(files.genotype, files.spec, files.weights, args.output, data=data)
    print(f"exported run {files.run_id} to {out}: model.py imports only torch; load(directory) gives the "
          "module, load_scorer(directory) scores raw rows")
    return 0
