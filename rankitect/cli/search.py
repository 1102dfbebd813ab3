"""``rankitect search``: search architectures (NE vs FLOPs), every candidate tracked in MLflow.

Prints the candidates' table, the Bayes-optimal floor when the data knows it, and closes with the
winner the rule chose against the best baseline (and the best candidate apart when it lost, and
why); logs the winner as an MLflow pyfunc that scores raw feature columns.
"""

from __future__ import annotations

import argparse
from typing import Any

from rankitect.cli.arguments import add_config_args, flag_overrides, set_threads
from rankitect.config import Config
from rankitect.errors import UserError

FLAGS = {
    "strategy": "search.strategy", "space": "search.space", "trials": "search.trials", "steps": "train.steps",
    "seed": "search.seed", "target_mflops": "search.target_mflops", "workers": "search.workers",
    "storage": "search.storage", "study_name": "search.study_name", "time_budget": "search.time_budget",
}


def add_commands(sub: Any) -> None:
    search = sub.add_parser("search", help="search architectures (NE vs FLOPs), tracked in MLflow")
    search.add_argument("--strategy", help="random | evolution | tpe | nsga2 | oneshot | dnas")
    search.add_argument("--space", help="nasrec | engineer")
    search.add_argument("--trials", type=int, help="candidates to train")
    search.add_argument("--steps", type=int, help="cap on training steps per candidate (default: epochs decide)")
    search.add_argument("--time-budget", help="wall clock of the whole search, e.g. 90m, 4h")
    search.add_argument("--seed", type=int)
    search.add_argument("--target-mflops", type=float, help="FLOPs target of the penalty (MFLOPs/example)")
    search.add_argument("--workers", type=_workers, help="local worker processes training the trials, or auto (the "
                                                         "default: one per core, at most 4)")
    search.add_argument("--storage", help="Optuna RDB URL shared by several search processes")
    search.add_argument("--study-name", help="study name in --storage")
    search.add_argument("--resume", metavar="RUN_ID", help="continue the search of this MLflow run")
    add_config_args(search)
    search.set_defaults(handler=cmd_search, flags=FLAGS)


def _workers(value: str) -> int | str:
    """``--workers``: a number (checked with the config's range) or ``auto``."""
    return value if value == "auto" else int(value)


def cmd_search(args: argparse.Namespace, cfg: Config) -> int:
    from rankitect.search.running.progress import SearchProgress
    from rankitect.search.running.runner import SearchRunner

    if cfg.runtime.compile or cfg.runtime.precision != "fp32":
        print("note: runtime.compile and runtime.precision apply to train and finetune; search trials run eager "
              "fp32 (a cold compile costs more than a few hundred steps save: bench/speed/runtime_bench.py)")
    if args.resume:
        runner = SearchRunner.resume(args.resume, cfg, flag_overrides(args, args.flags) + list(args.overrides))
    else:
        set_threads(cfg)
        runner = SearchRunner(cfg)
    set_threads(runner.cfg)  # a resumed search: its saved runtime.threads, unless overridden
    print(f"search run {runner.state.parent_run_id}: strategy {runner.cfg.search.strategy}, "
          f"space {runner.cfg.search.space}, {runner.candidate_budget()} candidates, data {runner.data.path}",
          flush=True)
    progress = SearchProgress(runner.trial_budget(), time_budget=runner.budget.seconds, elapsed=runner.budget.spent(),
                              before=runner.finished_results(), workers=runner.plan.workers)
    runner.watch(progress)
    estimate = runner.estimate()
    if estimate is not None:
        progress.estimate(estimate.per_trial)
        progress.write(estimate.line)
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


def _time_line(spent: dict[str, float], plan: Any) -> str:
    """The search's wall time and what its trainings took; with several workers the trainings' minutes
    are the workers' (they run side by side, so they add up to more than the wall time).

    >>> from rankitect.search.running.launch import WorkerPlan
    >>> _time_line({"baselines": 120.0, "candidates": 60.0, "other": 30.0, "total": 210.0}, WorkerPlan(1, 2))
    'time: 3.5 min (baselines 2.0, candidates 1.0, other 0.5 min) on 1 process x 2 threads'
    >>> _time_line({"baselines": 240.0, "candidates": 120.0, "other": 0.0, "total": 210.0}, WorkerPlan(2, 1))
    'time: 3.5 min on 2 workers x 1 thread; the trainings took baselines 4.0, candidates 2.0 worker-min'
    """
    total = f"time: {spent['total'] / 60:.1f} min"
    if plan.workers == 1:
        parts = ", ".join(f"{k} {spent[k] / 60:.1f}" for k in spent if k != "total" and spent[k] > 0)
        return f"{total} ({parts} min) on {plan.words()}"
    parts = ", ".join(f"{k} {spent[k] / 60:.1f}" for k in spent if k not in ("total", "other") and spent[k] > 0)
    return f"{total} on {plan.words()}; the trainings took {parts} worker-min"


def _print_outcome(outcome: Any, runner: Any) -> None:
    from rankitect.eval.pareto import front_note, verdict
    from rankitect.track.location import store_args

    cols = ["name", "kind", "status", "val_ne", "test_ne", "test_auc", "mflops", "params", "objective", "on_front", "winner"]
    print()
    print(outcome.table[cols].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    bayes = runner.data.split("test").bayes_ne
    if bayes is not None:
        print(f"\nBayes-optimal test NE (the floor): {bayes:.4f}")
    if outcome.best is not None:
        print(f"best genotype: {outcome.out_dir / 'best_genotype.json'}")
    # the closing lines: the winner the rule chose (what export and the logged model hold), against
    # the best baseline; the best candidate apart when it lost, and why
    chosen = getattr(outcome, "verdict", None)
    print("\n".join(chosen.lines(runner.cfg.search.min_gain_se)) if chosen is not None else verdict(outcome.table))
    note = front_note(outcome.table)
    if note is not None:
        print(note)
    if outcome.spending:
        print(_time_line(outcome.spending, runner.plan))
    store = store_args(runner.tracker.uri)
    print(f"MLflow search run: {outcome.parent_run_id}  (rankitect runs {outcome.parent_run_id}{store}; "
          f"rankitect export {outcome.parent_run_id} -o winner/{store}; rankitect ui{store})")
