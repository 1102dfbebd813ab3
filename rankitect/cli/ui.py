"""``rankitect ui``: the MLflow UI on the run store, opened on the searches and their candidates.

The store must exist (``ui`` creates none) and the port must be free (a port in use is an error
naming it, not the other server's page). The server runs in a process group of its own that ends
with the command however the command ends (:func:`~rankitect.track.location.serve_ui`). Without
``-v`` the server prints errors only: no request log, no third-party warnings.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from rankitect.cli.arguments import add_config_args
from rankitect.config import Config

QUIET_UVICORN = "--no-access-log --log-level warning"


def add_commands(sub: Any) -> None:
    ui = sub.add_parser("ui", help="open the MLflow UI on the run store")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=5000)
    add_config_args(ui)
    ui.set_defaults(handler=cmd_ui, flags={})


def cmd_ui(args: argparse.Namespace, cfg: Config) -> int:
    from rankitect.cli.tracked import open_tracker
    from rankitect.errors import UserError
    from rankitect.track import ui_command
    from rankitect.track.location import check_port, serve_ui
    from rankitect.verbosity import QUIET_ENV

    try:
        argv = ui_command(cfg.track.uri, host=args.host, port=args.port)
    except ValueError as e:
        raise UserError(f"--port {args.port}: {e}") from None
    tracker = open_tracker(cfg)  # a store that does not exist is an error naming it, never created
    check_port(args.host, args.port)
    # One worker and no background job runners: a local UI starts in about a second and stops
    # cleanly on Ctrl-C (the defaults start a dozen processes that outlive SIGTERM).
    env = {"MLFLOW_WORKERS": "1", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    if os.environ.get(QUIET_ENV):  # no -v: no request log, no deprecation warnings of the server's libraries
        argv += ["--uvicorn-opts", QUIET_UVICORN]
        env["PYTHONWARNINGS"] = "ignore"
    print(f"MLflow UI for {tracker.uri}: searches and their candidates at "
          f"http://{args.host}:{args.port}/{tracker.runs_view_path()} (Ctrl-C stops it)", flush=True)
    return serve_ui(argv, env)
