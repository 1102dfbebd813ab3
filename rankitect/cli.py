"""The ``rankitect`` command line.

Every subcommand takes ``-c/--config FILE`` (YAML) and ``key=value`` overrides anywhere on the
line, e.g. ``rankitect search --strategy evolution search.trials=8 train.steps=200`` or
``rankitect runs track.uri=sqlite:///runs/mlflow.db RUN_ID``. Flags are shorthands for overrides.
``-v`` shows third-party INFO logs and warnings. User errors (a bad file, key or value) print one
line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rankitect.cli_models import cmd_export, cmd_finetune, cmd_probe, cmd_train, set_threads
from rankitect.cli_output import set_verbosity
from rankitect.config import Config, load_config
from rankitect.errors import UserError
from rankitect.track.store import serve_ui, store_args
from rankitect.signals import Stopped, stop_on_signals

Handler = Callable[[argparse.Namespace, Config], int]
# A config override: a dotted key (``data.rows``), then ``=``. Told apart from positional arguments
# (run ids, files) before argparse sees the line, so an override may stand anywhere.
OVERRIDE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+=")
VERBOSE = ("-v", "--verbose")


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

    print(f"data set: {desc.get('name', '?')}  (source: {desc.get('source', '?')}, {desc.get('path', '')})")
    splits = pd.DataFrame(desc["splits"]).T
    for col in ("rows", "requests"):
        if col in splits:
            splits[col] = splits[col].astype("Int64")
    print(splits.to_string(float_format=lambda v: f"{v:.4f}"))
    feats = pd.DataFrame(desc["features"])
    feats["vocab_size"] = feats["vocab_size"].map(lambda v: "-" if pd.isna(v) else str(int(v)))
    print(f"\n{desc.get('n_dense', '?')} dense and {desc.get('n_sparse', '?')} sparse features "
          f"(label: {desc.get('label', '?')})")
    print(feats.to_string(index=False))


# --- search / train / runs / ui -----------------------------------------------------------------


def cmd_search(args: argparse.Namespace, cfg: Config) -> int:
    from rankitect.search.progress import SearchProgress
    from rankitect.search.runner import SearchRunner

    if cfg.runtime.compile or cfg.runtime.precision != "fp32":
        print("note: runtime.compile and runtime.precision apply to train and finetune; search trials run eager "
              "fp32 (a cold compile costs more than a few hundred steps save: bench/runtime_bench.py)")
    if args.resume:
        runner = SearchRunner.resume(args.resume, cfg, _flag_overrides(args, args.flags) + list(args.overrides))
    else:
        set_threads(cfg)
        runner = SearchRunner(cfg)
    set_threads(runner.cfg)  # a resumed search: its saved runtime.threads, unless overridden
    print(f"search run {runner.state.parent_run_id}: strategy {runner.cfg.search.strategy}, "
          f"space {runner.cfg.search.space}, {runner.candidate_budget()} candidates, data {runner.data.path}",
          flush=True)
    budget = getattr(runner, "budget", None)
    progress = SearchProgress(runner.trial_budget(), time_budget=None if budget is None else budget.seconds,
                              done=len(runner.state.trials), elapsed=0.0 if budget is None else budget.spent())
    runner.watch(progress)
    try:
        outcome = runner.run()
    finally:
        progress.close()
    _print_outcome(outcome, runner)
    _log_winner_model(runner, outcome)
    return 0


def _log_winner_model(runner: Any, outcome: Any) -> None:
    """Log the winner as an MLflow pyfunc taking raw feature columns (its export directory)."""
    import tempfile

    from rankitect.export import export_from_files

    if outcome.best is None or not runner.owner:
        return
    with tempfile.TemporaryDirectory() as tmp:
        try:
            files = runner.tracker.fetch_model_files(outcome.parent_run_id, f"{tmp}/files")
            export_from_files(files.genotype, files.spec, files.weights, f"{tmp}/export", data=runner.data)
            uri = runner.tracker.log_raw_rows_model(files.run_id, f"{tmp}/export")
        except (UserError, ValueError, OSError) as e:  # the search is done: say why, lose nothing
            print(f"winner not logged as an MLflow model: {e}")
            return
    print(f"winner logged as an MLflow model of run {files.run_id}: mlflow.pyfunc.load_model({uri!r}) "
          "scores a DataFrame of raw feature columns")


def _print_outcome(outcome: Any, runner: Any) -> None:
    cols = ["name", "kind", "status", "val_ne", "test_ne", "test_auc", "mflops", "params", "objective", "on_front", "winner"]
    print()
    print(outcome.table[cols].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    bayes = runner.data.split("test").bayes_ne
    if bayes is not None:
        print(f"\nBayes-optimal test NE (the floor): {bayes:.4f}")
    winner = outcome.table[outcome.table["winner"]]
    if outcome.best is not None and len(winner):
        row = winner.iloc[0]
        print(f"found {outcome.best.hash}: test NE {row['test_ne']:.4f}, test AUC {row['test_auc']:.4f}, "
              f"{row['mflops']:.3f} MFLOPs per example")
    if outcome.best is not None:
        print(f"best genotype: {outcome.out_dir / 'best_genotype.json'}")
    from rankitect.eval.pareto import verdict

    print(verdict(outcome.table))
    if outcome.spending:
        spent = outcome.spending
        parts = ", ".join(f"{k} {spent[k] / 60:.1f}" for k in spent if k != "total" and spent[k] > 0)
        print(f"time: {spent['total'] / 60:.1f} min ({parts} min)")
    store = store_args(runner.tracker.uri)
    print(f"MLflow search run: {outcome.parent_run_id}  (rankitect runs {outcome.parent_run_id}{store}; "
          f"rankitect export {outcome.parent_run_id} -o winner/{store}; rankitect ui{store})")


def cmd_runs(args: argparse.Namespace, cfg: Config) -> int:
    import pandas as pd

    from rankitect.cli_models import open_tracker

    tracker = open_tracker(cfg)
    table = tracker.runs_table(args.run_id) if args.run_id else tracker.searches_table()
    if not len(table):
        print("no runs" + (f" under {args.run_id}" if args.run_id else "") + f" in {tracker.uri}")
        return 0
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.drop(columns=[c for c in ("parent_id", "error") if c in table]).to_string(index=False))
    return 0


def cmd_ui(args: argparse.Namespace, cfg: Config) -> int:
    from rankitect.track import Tracker, resolve_uri, ui_command

    argv = ui_command(cfg.track.uri, host=args.host, port=args.port)
    # One worker and no background job runners: a local UI starts in about a second and stops
    # cleanly on Ctrl-C (the defaults start a dozen processes that outlive SIGTERM).
    env = {"MLFLOW_WORKERS": "1", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    tracker = Tracker(cfg.track.uri, cfg.track.experiment)
    print(f"MLflow UI for {resolve_uri(cfg.track.uri)}: searches and their candidates at "
          f"http://{args.host}:{args.port}/{tracker.runs_view_path()} (Ctrl-C stops it)", flush=True)
    return serve_ui(argv, env)


# --- parser -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rankitect", description="Neural architecture search for ranking (CTR) models."
    )
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show third-party INFO logs and warnings (MLflow, Lightning, torch); anywhere on the line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    search = sub.add_parser("search", help="search architectures (NE vs FLOPs), tracked in MLflow")
    search.add_argument("--strategy", help="random | evolution | tpe | nsga2 | oneshot | dnas")
    search.add_argument("--space", help="nasrec | engineer")
    search.add_argument("--trials", type=int, help="candidates to train")
    search.add_argument("--steps", type=int, help="cap on training steps per candidate (default: epochs decide)")
    search.add_argument("--time-budget", help="wall clock of the whole search, e.g. 90m, 4h")
    search.add_argument("--seed", type=int)
    search.add_argument("--target-mflops", type=float, help="FLOPs target of the penalty (MFLOPs/example)")
    search.add_argument("--workers", type=int, help="local worker processes")
    search.add_argument("--storage", help="Optuna RDB URL shared by several search processes")
    search.add_argument("--study-name", help="study name in --storage")
    search.add_argument("--resume", metavar="RUN_ID", help="continue the search of this MLflow run")
    _add_config_args(search)
    search.set_defaults(handler=cmd_search, flags={
        "strategy": "search.strategy", "space": "search.space", "trials": "search.trials", "steps": "train.steps",
        "seed": "search.seed", "target_mflops": "search.target_mflops", "workers": "search.workers",
        "storage": "search.storage", "study_name": "search.study_name",
        "time_budget": "search.time_budget"})

    train = sub.add_parser("train", help="train one architecture and log it to MLflow")
    train.add_argument("--arch", required=True, help="a genotype JSON file or baseline:NAME")
    train.add_argument("--steps", type=int)
    _add_config_args(train)
    train.set_defaults(handler=cmd_train, flags={"steps": "train.steps"})

    runs = sub.add_parser("runs", help="list searches, or the candidates of one search by NE")
    runs.add_argument("run_id", nargs="?", help="a search's MLflow run id")
    _add_config_args(runs)
    runs.set_defaults(handler=cmd_runs, flags={})

    export = sub.add_parser("export", help="write a tracked model as a standalone model.py + weights")
    export.add_argument("run_id", help="a candidate's or baseline's run id, or a search run (its winner)")
    export.add_argument("-o", "--output", required=True, help="output directory")
    _add_config_args(export)
    export.set_defaults(handler=cmd_export, flags={})

    finetune = sub.add_parser("finetune", help="train a tracked model further, as a new run")
    finetune.add_argument("run_id", help="a candidate's or baseline's run id, or a search run (its winner)")
    finetune.add_argument("--steps", type=int, help="training steps (default: train.steps)")
    start = finetune.add_mutually_exclusive_group()
    start.add_argument("--from-scratch", action="store_true", help="re-initialize instead of loading weights")
    start.add_argument("--from-supernet", action="store_true",
                       help="start from the weights cut out of the search's supernet (oneshot, dnas)")
    _add_config_args(finetune)
    finetune.set_defaults(handler=cmd_finetune, flags={"steps": "train.steps"})

    probe = sub.add_parser("probe", help="which linear layers may train in FP8: emulated error per layer")
    probe.add_argument("target", help="a run with kept weights (candidate, baseline or search: its winner), "
                       "or a genotype JSON file or baseline:NAME (random init)")
    probe.add_argument("--steps", type=int, default=0, help="genotype or baseline: train this many steps first")
    probe.add_argument("--batches", type=int, default=8, help="training batches to probe with (default 8)")
    probe.add_argument("--threshold", type=float, help="largest safe relative error (runtime.fp8_threshold)")
    probe.add_argument("--scaling", choices=["tensorwise", "rowwise"], help="FP8 scaling (runtime.fp8_scaling)")
    _add_config_args(probe)
    probe.set_defaults(handler=cmd_probe,
                       flags={"threshold": "runtime.fp8_threshold", "scaling": "runtime.fp8_scaling"})

    ui = sub.add_parser("ui", help="open the MLflow UI on the run store")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=5000)
    _add_config_args(ui)
    ui.set_defaults(handler=cmd_ui, flags={})

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


def _explicit_keys(path: str | None, overrides: list[str]) -> set[str]:
    """The dotted config keys a user set (in ``-c FILE`` or as overrides), not left at their default."""
    from rankitect.config import _read_yaml, flatten

    keys = {o.partition("=")[0].strip() for o in overrides}
    return keys | (set(flatten(_read_yaml(path))) if path else set())


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
        overrides = _flag_overrides(args, args.flags) + list(args.overrides)
        cfg = load_config(args.config, overrides)
        args.explicit = _explicit_keys(args.config, overrides)
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


if __name__ == "__main__":
    raise SystemExit(main())
