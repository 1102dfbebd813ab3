"""``rankitect ui``: the MLflow UI on the run store, opened on the searches and their candidates."""

from __future__ import annotations

import argparse
import os
from typing import Any

from rankitect.cli.arguments import add_config_args
from rankitect.config import Config


def add_commands(sub: Any) -> None:
    ui = sub.add_parser("ui", help="open the MLflow UI on the run store")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=5000)
    add_config_args(ui)
    ui.set_defaults(handler=cmd_ui, flags={})


def cmd_ui(args: argparse.Namespace, cfg: Config) -> int:
    from rankitect.track import Tracker, resolve_uri, ui_command
    from rankitect.track.store import serve_ui

    argv = ui_command(cfg.track.uri, host=args.host, port=args.port)
    # One worker and no background job runners: a local UI starts in about a second and stops
    # cleanly on Ctrl-C (the defaults start a dozen processes that outlive SIGTERM).
    env = {"MLFLOW_WORKERS": "1", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    tracker = Tracker(cfg.track.uri, cfg.track.experiment)
    print(f"MLflow UI for {resolve_uri(cfg.track.uri)}: searches and their candidates at "
          f"http://{args.host}:{args.port}/{tracker.runs_view_path()} (Ctrl-C stops it)", flush=True)
    return serve_ui(argv, env)
