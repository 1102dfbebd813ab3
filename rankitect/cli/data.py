"""``rankitect data synth | inspect``: write the seeded synthetic data set, or describe a data set."""

from __future__ import annotations

import argparse
from typing import Any

from rankitect.cli.arguments import add_config_args
from rankitect.config import Config


def add_commands(sub: Any) -> None:
    data = sub.add_parser("data", help="write or inspect click data sets")
    data_sub = data.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    synth = data_sub.add_parser("synth", help="write a seeded synthetic data set (knows its Bayes NE; "
                                              "data.source=synthetic-categorical: the all-categorical one)")
    synth.add_argument("--rows", type=int, help="rows to generate (default: data.rows)")
    synth.add_argument("--seed", type=int, help="generator seed (default: data.seed)")
    synth.add_argument("-o", "--output", help="output directory (default: data/synthetic)")
    add_config_args(synth)
    synth.set_defaults(handler=cmd_data_synth, flags={"rows": "data.rows", "seed": "data.seed"})
    inspect_ = data_sub.add_parser("inspect", help="print rows, CTR, features, vocab sizes, Bayes NE")
    inspect_.add_argument("source", nargs="?",
                          help="synthetic | synthetic-categorical | a Criteo TSV | CSV/parquet | a cache dir")
    add_config_args(inspect_)
    inspect_.set_defaults(handler=cmd_data_inspect, flags={})


def cmd_data_synth(args: argparse.Namespace, cfg: Config) -> int:
    from rankitect.errors import ConfigError
    from rankitect.data import describe, generate_synthetic
    from rankitect.data.synthetic_categorical import SOURCE, generate_categorical

    generate = generate_categorical if cfg.data.source == SOURCE else generate_synthetic
    out = args.output or f"data/{cfg.data.source if cfg.data.source == SOURCE else 'synthetic'}"
    given = {"rows": cfg.data.rows, "ctr": cfg.data.ctr}
    if cfg.data.history:
        if generate is not generate_categorical:
            raise ConfigError(f"config key 'data.history': {cfg.data.history} applies to {SOURCE} only")
        given["history"] = cfg.data.history
    data = generate(out, **{k: v for k, v in given.items() if v is not None}, seed=cfg.data.seed,
                    progress=True)  # None: the generator's default
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

    print(f"data set: {desc.get('name', '?')}  (source: {desc.get('source', '?')}, {desc.get('path', '')})")
    splits = pd.DataFrame(desc["splits"]).T
    for col in ("rows", "requests"):
        if col in splits:
            splits[col] = splits[col].astype("Int64")
    print(splits.to_string(float_format=lambda v: f"{v:.4f}"))
    feats = pd.DataFrame(desc["features"])
    feats["vocab_size"] = feats["vocab_size"].map(lambda v: "-" if pd.isna(v) else str(int(v)))
    histories = sum(f["kind"] == "history" for f in desc["features"])
    also = f" and {histories} history" if histories else ""
    print(f"\n{desc.get('n_dense', '?')} dense and {desc.get('n_sparse', '?')} sparse features{also} "
          f"(label: {desc.get('label', '?')})")
    print(feats.to_string(index=False))
