"""The ``rankitect`` command line.

Every subcommand takes ``-c/--config FILE`` (YAML) and trailing ``key=value`` overrides, e.g.
``rankitect search --strategy evolution search.trials=8 train.steps=200``. Flags are shorthands for
overrides. User errors (a bad file, key or value) print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rankitect.config import Config, load_config
from rankitect.errors import UserError

Handler = Callable[[argparse.Namespace, Config], int]


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", help="YAML config file (see configs/)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. train.steps=200")


def _flag_overrides(args: argparse.Namespace, mapping: dict[str, str]) -> list[str]:
    """Turn the flags that were given into ``key=value`` overrides (flags win over the file)."""
    out = []
    for attr, key in mapping.items():
        value = getattr(args, attr, None)
        if value is not None:
            out.append(f"{key}={json.dumps(value) if isinstance(value, str) else value}")
    return out


# --- data ---------------------------------------------------------------------------------------


def cmd_data_synth(args: argparse.Namespace, cfg: Config) -> int:
    from rankitect.data import describe, generate_synthetic

    out = args.output or "data/synthetic"
    data = generate_synthetic(out, rows=cfg.data.rows, seed=cfg.data.seed, progress=True)
    _print_description(describe(data))
    print(f"written to {out}")
    return 0


def cmd_data_inspect(args: argparse.Namespace, cfg: Config) -> int:
    from rankitect.data import describe, open_data

    data = open_data(args.source or cfg.data.source, cfg.data)
    _print_description(describe(data))
    return 0


def _print_description(desc: dict[str, Any]) -> None:
    import pandas as pd

    print(f"data set: {desc.get('name', '?')}  (source: {desc.get('source', '?')})")
    splits = pd.DataFrame(desc["splits"]).T
    print(splits.to_string())
    feats = pd.DataFrame(desc["features"])
    print(feats.to_string(index=False))


# --- parser -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rankitect", description="Neural architecture search for ranking (CTR) models."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    data = sub.add_parser("data", help="write or inspect click data sets")
    data_sub = data.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    synth = data_sub.add_parser("synth", help="write the seeded synthetic data set (knows its Bayes NE)")
    synth.add_argument("--rows", type=int, help="rows to generate (default: data.rows)")
    synth.add_argument("--seed", type=int, help="generator seed (default: data.seed)")
    synth.add_argument("-o", "--output", help="output directory (default: data/synthetic)")
    _add_config_args(synth)
    synth.set_defaults(handler=cmd_data_synth, flags={"rows": "data.rows", "seed": "data.seed"})
    inspect_ = data_sub.add_parser("inspect", help="print rows, CTR, features, vocab sizes, Bayes NE")
    inspect_.add_argument("source", nargs="?", help="synthetic | a Criteo TSV | CSV/parquet | a cache dir")
    _add_config_args(inspect_)
    inspect_.set_defaults(handler=cmd_data_inspect, flags={})
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        overrides = _flag_overrides(args, args.flags) + list(args.overrides)
        cfg = load_config(args.config, overrides)
        return int(args.handler(args, cfg) or 0)
    except UserError as e:
        print(f"rankitect: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rankitect: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
