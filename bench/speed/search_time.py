"""Where a default search's wall time goes: baselines, supernet, candidates trained and pruned, and
inside each trial its preparation, training steps, validations and scoring (test and held-out rows).

    python -m bench.speed.search_time --data synthetic-categorical --seeds 0,1,2
    python -m bench.speed.search_time --data adult --set search.pruning=none
    python -m bench.speed.search_time --quick

Each search is the real ``rankitect search --strategy dnas`` (``--strategy``) run in this process
with one worker (``search.workers=1``, so that every trial runs where the timers are), on a scratch
MLflow store. Timers wrap what a trial does: pricing, costing and building the model
(``prepare``), the protocol's validations (``validate``), the scoring of the returned model on the
test split and on the verdict's held-out rows (``score``: ``held-out`` alone too); the rest of a
trial's wall time is its training steps (``steps``). Per search it prints each part's seconds for
ok, pruned and failed trials, the baselines apart, the supernet phase, the verdict's own share of
the search's wall time (held-out scoring plus the final choice), and what pruned trials cost
against the trials that finished.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.common import SHARED_DATA, parse_args

DATA = {"adult": [f"data.source={SHARED_DATA / 'adult.csv'}", f"data.schema={SHARED_DATA / 'adult.yaml'}"],
        "synthetic": [], "synthetic-categorical": ["data.source=synthetic-categorical"],
        "rare": ["data.ctr=0.0064", "data.rows=100000"]}
PARTS = ("prepare", "steps", "validate", "score")


OUTSIDE = ("estimate", "supernet", "propose", "record", "verdict", "log winner")


class Clock:
    """Seconds by (trial kind and status, part); the trial running now collects into ``current``;
    the search's own work outside its trials by part (:data:`OUTSIDE`) in ``outside``."""

    def __init__(self) -> None:
        self.outside: dict[str, float] = defaultdict(float)
        self.parts: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.current: dict[str, float] | None = None
        self.held_out = 0.0  # scoring on the verdict's held-out rows (part of "score")
        self.judge = 0.0  # the final choice
        self.counts: dict[tuple[str, str], int] = defaultdict(int)
        self.kind = "candidate"  # of the trial submitted last

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.current is not None:
                self.current[name] += time.perf_counter() - start


def _timed(clock: Clock, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with clock.part(part):
            return fn(*args, **kwargs)
    return wrapped


def _outside(clock: Clock, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` timed into ``clock.outside[part]`` (the search's work between trials)."""
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            clock.outside[part] += time.perf_counter() - start
    return wrapped


def instrument(clock: Clock, stack: contextlib.ExitStack) -> None:
    """Wrap what trials do with ``clock``'s timers (undone when ``stack`` closes)."""
    from unittest import mock

    import rankitect.cli.search as cli_search
    import rankitect.search.judging.standings as standings
    import rankitect.search.running.launch as launch
    import rankitect.search.running.record as record
    import rankitect.search.running.runner as runner
    from rankitect.search.base import STRATEGIES
    import rankitect.search.running.trial as trial
    import rankitect.space as space
    import rankitect.train.loop as loop
    import rankitect.train.protocol as protocol

    real_run = trial.run_trial

    def run_trial(arch: Any, data: Any, cfg: Any, *args: Any, **kwargs: Any) -> Any:
        clock.current = defaultdict(float)
        start = time.perf_counter()
        out = real_run(arch, data, cfg, *args, **kwargs)
        total = time.perf_counter() - start
        key = (clock.kind, out.result.status)
        parts = clock.current
        parts["steps"] = total - sum(parts[p] for p in PARTS if p != "steps")
        for p in PARTS:
            clock.parts[key][p] += parts[p]
        clock.counts[key] += 1
        clock.current = None
        return out

    real_held = loop.held_out_losses

    def held_out_losses(*args: Any, **kwargs: Any) -> Any:  # its scoring counts in "score" (loop.scored)
        start = time.perf_counter()
        out = real_held(*args, **kwargs)
        clock.held_out += time.perf_counter() - start
        return out

    real_submit = launch.Launcher.submit

    def submit(self: Any, kind: str, *args: Any, **kwargs: Any) -> Any:  # one worker: runs the trial now
        clock.kind = kind
        return real_submit(self, kind, *args, **kwargs)

    real_judge = standings.Standings.judge

    def judge(self: Any, trials: Any) -> Any:
        start = time.perf_counter()
        out = real_judge(self, trials)
        clock.judge += time.perf_counter() - start
        return out

    real_record = record.Recorder.record

    def record_trial(self: Any, *args: Any, **kwargs: Any) -> Any:  # the strategy's tell happens just before
        start = time.perf_counter()
        try:
            return real_record(self, *args, **kwargs)
        finally:
            clock.outside["record"] += time.perf_counter() - start

    patches = [
        mock.patch.object(trial, "run_trial", run_trial),
        mock.patch.object(trial, "check_fits", _timed(clock, "prepare", trial.check_fits)),
        mock.patch.object(trial, "measure", _timed(clock, "prepare", trial.measure)),
        mock.patch.object(space, "build_model", _timed(clock, "prepare", space.build_model)),
        mock.patch.object(protocol.Protocol, "validate", _timed(clock, "validate", protocol.Protocol.validate)),
        mock.patch.object(loop, "scored", _timed(clock, "score", loop.scored)),
        mock.patch.object(loop, "held_out_losses", held_out_losses),
        mock.patch.object(standings.Standings, "judge", judge),
        mock.patch.object(launch.Launcher, "submit", submit),
        mock.patch.object(record.Recorder, "record", record_trial),
        mock.patch.object(runner.SearchRunner, "estimate", _outside(clock, "estimate", runner.SearchRunner.estimate)),
        mock.patch.object(runner.SearchRunner, "_start_strategy",
                          _outside(clock, "supernet", runner.SearchRunner._start_strategy)),
        mock.patch.object(runner, "record_verdict", _outside(clock, "verdict", runner.record_verdict)),
        mock.patch.object(cli_search, "_log_winner_model", _outside(clock, "log winner", cli_search._log_winner_model)),
    ]
    for strategy in STRATEGIES.values():  # what a proposal costs (surrogate ranking, FLOPs of changes)
        if "ask" in vars(strategy):
            patches.append(mock.patch.object(strategy, "ask", _outside(clock, "propose", vars(strategy)["ask"])))
    for p in patches:
        stack.enter_context(p)


def one_search(data: str, seed: int, strategy: str, sets: list[str], out: Path) -> dict[str, Any]:
    """Run one search under the timers; its parts, budget accounting and wall seconds."""
    import json

    from rankitect.cli import main

    clock = Clock()
    argv = ["search", "--strategy", strategy, "--seed", str(seed), f"train.seed={seed}", *DATA.get(data, [data]),
            f"track.uri=sqlite:///{out}/mlflow.db", f"search.output_dir={out}/searches", "search.workers=1",
            "train.progress=false", *sets]
    with contextlib.ExitStack() as stack:
        instrument(clock, stack)
        start = time.perf_counter()
        code = main(argv)
        wall = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"search failed ({code}): {' '.join(argv)}")
    state = json.loads(next((out / "searches").glob("*/state.json")).read_text())
    return {"wall": wall, "elapsed": state.get("elapsed"), "clock": clock}


def report(name: str, r: dict[str, Any]) -> None:
    clock: Clock = r["clock"]
    wall = r["wall"]
    print(f"\n== {name}: {wall / 60:.1f} min wall ==")
    print(f"{'trials':<22}{'n':>4}" + "".join(f"{p:>10}" for p in PARTS) + f"{'total':>10}{'share':>8}")
    trained = 0.0
    for key in sorted(clock.parts):
        parts, n = clock.parts[key], clock.counts[key]
        total = sum(parts.values())
        trained += total
        print(f"{key[0] + ' ' + key[1]:<22}{n:>4}" + "".join(f"{parts[p]:>10.1f}" for p in PARTS)
              + f"{total:>10.1f}{100 * total / wall:>7.1f}%")
    print(f"outside trials: {wall - trained:.1f} s ({100 * (wall - trained) / wall:.1f}%), of it "
          + ", ".join(f"{part} {clock.outside[part]:.1f} s" for part in OUTSIDE)
          + f", the rest (imports, data, MLflow runs) {wall - trained - sum(clock.outside.values()):.1f} s")
    verdict = clock.held_out + clock.judge
    print(f"the verdict: held-out scoring {clock.held_out:.1f} s + the final choice {clock.judge:.2f} s = "
          f"{100 * verdict / wall:.2f}% of the wall time")
    pruned = clock.parts.get(("candidate", "pruned"), {})
    if pruned:
        total = sum(pruned.values())
        print("pruned trials' time: " + ", ".join(f"{p} {100 * pruned[p] / total:.0f}%" for p in PARTS))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="synthetic-categorical",
                        help=f"one of {sorted(DATA)} or a data.source (default: synthetic-categorical)")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--strategy", default="dnas")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every search")
    args = parse_args(parser, {"data": "synthetic", "set": [
        "data.rows=3000", "search.baselines=[dlrm]", "search.trials=1", "train.steps=5", "train.val_every=5",
        "search.dnas.supernet.steps=10", "search.dnas.weights_only_steps=2"]}, argv)
    for seed in (int(s) for s in args.seeds.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            r = one_search(args.data, seed, args.strategy, args.set, Path(tmp))
        report(f"{args.strategy} on {args.data}, seed {seed}", r)


if __name__ == "__main__":
    main()
