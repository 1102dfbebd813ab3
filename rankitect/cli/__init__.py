"""The ``rankitect`` command line: one module per command group, this one reads the line.

Every subcommand takes ``-c/--config FILE`` (YAML) and ``key=value`` overrides anywhere on the
line, e.g. ``rankitect search --strategy evolution search.trials=8 train.steps=200`` or
``rankitect runs track.uri=sqlite:///runs/mlflow.db RUN_ID``. Flags are shorthands for overrides.
``-v`` shows third-party INFO logs and warnings. User errors (a bad file, key or value) print one
line and exit with status 2.

Commands: :mod:`~rankitect.cli.search`, :mod:`~rankitect.cli.train`, :mod:`~rankitect.cli.runs`,
:mod:`~rankitect.cli.export`, :mod:`~rankitect.cli.finetune`, :mod:`~rankitect.cli.probe`,
:mod:`~rankitect.cli.ui`, :mod:`~rankitect.cli.data`; each adds its parser with ``add_commands``
and sets a ``handler(args, cfg) -> exit status``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rankitect.cli import data, export, finetune, probe, runs, search, train, ui
from rankitect.cli.arguments import OVERRIDE, VERBOSE, explicit_keys, flag_overrides
from rankitect.config import load_config
from rankitect.errors import UserError
from rankitect.signals import Stopped, stop_on_signals
from rankitect.verbosity import set_verbosity

COMMAND_GROUPS = (search, train, runs, export, finetune, probe, ui, data)  # in the order --help lists them


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rankitect", description="Neural architecture search for ranking (CTR) models."
    )
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show third-party INFO logs and warnings (MLflow, Lightning, torch); anywhere on the line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in COMMAND_GROUPS:
        group.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    set_verbosity(any(a in VERBOSE for a in argv))
    # key=value overrides may stand anywhere (before a run id, after flags): taken out first
    overrides = [a for a in argv if OVERRIDE.match(a)]
    args, rest = parser.parse_known_args([a for a in argv if not OVERRIDE.match(a) and a not in VERBOSE])
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.overrides = list(getattr(args, "overrides", [])) + overrides
    try:
        overrides = flag_overrides(args, args.flags) + list(args.overrides)
        cfg = load_config(args.config, overrides)
        args.explicit = explicit_keys(args.config, overrides)
        with stop_on_signals():  # SIGTERM and Ctrl-C end every command with 128 + the signal
            return int(args.handler(args, cfg) or 0)
    except UserError as e:  # one line, whatever a hostile value held
        print(f"rankitect: error: {str(e).replace(chr(10), chr(92) + 'n')}", file=sys.stderr)
        return 2
    except Stopped as e:  # SIGTERM or SIGINT (a search has said how to resume)
        print(f"rankitect: stopped by {e.name}", file=sys.stderr)
        return int(e.code)
    except KeyboardInterrupt:
        print("rankitect: interrupted", file=sys.stderr)
        return 130


__all__ = ["build_parser", "main"]
