"""What a running search shows: counts that match a scripted run and never pass their total, an ETA
from measured trial times, best NE and ETA within 80 columns, plain lines off a terminal; the
quick config's trial count."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import yaml

from rankitect.config import load_config
from rankitect.eval.result import TrialResult
from rankitect.search.running.checkpoint import TrialRecord
from rankitect.search.running.progress import SearchProgress
from rankitect.search.running.record import trial_line
from rankitect.search.running.runner import SearchRunner

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _result(status: str, ne: float | None = None) -> TrialResult:
    if status == "ok":
        return TrialResult(val_ne=ne, test_ne=ne, test_auc=0.7, mflops=1.0, train_seconds=1.0)
    if status == "pruned":
        return TrialResult.pruning("pruned", val_ne=ne, mflops=1.0, params=1, train_seconds=1.0, steps=3)
    return TrialResult.failure("diverged")


def _progress(total: int, clock: Clock, lines: list[str], **kw) -> SearchProgress:
    return SearchProgress(total, tty=False, echo=lines.append, clock=clock, heartbeat_s=3600.0,
                          stream=io.StringIO(), **kw)


def _counts(line: str) -> dict[str, str]:
    """``search 3/6: done 1, running 0, ...`` as {"search": "3/6", "done": "1", ...}."""
    import re

    line = re.sub(r" \(.*?\)", "", line).replace(": ", ", ")  # the running trials' details aside
    return dict(part.rsplit(" ", 1) for part in line.split(", "))


def test_a_scripted_run_counts_what_finished_and_measures_its_eta() -> None:
    clock, lines = Clock(), []
    progress = _progress(5, clock, lines)  # 2 baselines, 3 candidates
    script = [("dlrm", 10.0, "ok", 0.90), ("dcnv2", 20.0, "failed", None), ("c1", 6.0, "pruned", 0.95),
              ("c2", 12.0, "ok", 0.85)]
    seen: Counter[str] = Counter()
    durations: list[float] = []
    total = 5
    for name, seconds, status, ne in script:
        progress.started(name)
        clock.now += seconds
        progress.finished(name, _result(status, ne), f"[{name}] {status}")
        seen[status] += 1
        durations.append(seconds)
        total += status == "pruned"  # a pruned trial gives its slot back: one more to train
        counts = _counts(lines[-1])
        assert lines[-2] == f"[{name}] {status}"  # the trial's line, then the status line
        assert counts["search"] == f"{sum(seen.values())}/{total}"
        assert (counts["done"], counts["pruned"], counts["failed"]) == tuple(
            str(seen[s]) for s in ("ok", "pruned", "failed"))
        left = total - sum(seen.values())
        eta = left * sum(durations) / len(durations)  # what is left at the mean measured trial time
        assert progress.eta(clock.now) == eta
    assert _counts(lines[-1])["best val/ne"] == "0.8500"
    # a running trial at step 25 of 100 after 5 s has 15 s left at its own pace
    progress.started("c3")
    progress.stepper("c3")(25, 100, 1, 2)
    clock.now += 5
    assert progress.eta(clock.now) == 15.0 + (6 - 4 - 1) * sum(durations) / len(durations)
    assert "c3 epoch 1/2 step 25/100 5s" in progress.status(200)


def test_counts_start_from_the_checkpoint_and_never_pass_the_total() -> None:
    clock, lines = Clock(), []
    before = [_result("ok", 0.9), _result("pruned", 0.95), _result("failed")]
    progress = _progress(4, clock, lines, before=before, workers=2)
    counts = _counts(progress.status(200))
    assert counts["search"] == "3/5" and (counts["done"], counts["pruned"], counts["failed"]) == ("1", "1", "1")
    assert progress.eta(clock.now) is None  # nothing measured in this process yet, no estimate
    progress.estimate(40.0)
    assert progress.eta(clock.now) == 2 * 40.0 / 2  # two left, two workers
    for name in ("a", "b", "c"):  # more finish than the total holds (a shared search's other process)
        progress.started(name)
        progress.finished(name, _result("ok", 0.8), name)
    n, total = _counts(lines[-1])["search"].split("/")
    assert int(n) <= int(total)


def test_the_eta_never_passes_the_time_budget_left() -> None:
    clock, lines = Clock(), []
    progress = _progress(10, clock, lines, time_budget=100.0, elapsed=70.0)
    progress.started("a")
    clock.now += 10
    progress.finished("a", _result("ok", 0.9), "a")  # 9 left at 10 s each, 20 s of budget left
    assert progress.eta(clock.now) == 20.0


def test_best_ne_and_eta_stay_within_80_columns() -> None:
    clock, lines = Clock(), []
    progress = _progress(20, clock, lines, workers=4)
    progress.started("x")
    clock.now += 30
    progress.finished("x", _result("ok", 0.8765), "x")
    for name in ("dlrm", "dcnv2", "deepfm", "0123456789abcdef"):
        progress.started(name)
        progress.stepper(name)(120, 376, 2, 4)
    clock.now += 3
    full = progress.status(1000)
    assert "dlrm epoch 2/4 step 120/376" in full and len(full) > 80
    for width in (80, 60, 40):
        line = progress.status(width)
        assert len(line) <= width and "0.8765" in line and "ETA" in line, line


def test_off_a_terminal_lines_come_per_trial_and_per_minute_without_carriage_returns() -> None:
    clock, lines = Clock(), []
    stream = io.StringIO()
    progress = SearchProgress(3, tty=False, echo=lines.append, clock=clock, heartbeat_s=3600.0, stream=stream)
    progress.started("a")
    clock.now += 59
    progress.tick()
    assert lines == []  # not a minute yet
    clock.now += 2
    progress.tick()
    assert len(lines) == 1 and lines[0].startswith("search 0/3: done 0, running 1 (a 61s)")
    progress.tick()
    assert len(lines) == 1  # the next one a minute later
    progress.finished("a", _result("ok", 0.9), "[baseline] a")
    progress.close()
    assert lines[1] == "[baseline] a" and lines[2].startswith("search 1/3")
    assert not any("\r" in line for line in lines) and stream.getvalue() == ""


def test_candidate_lines_count_slots_and_never_pass_their_total() -> None:
    def line(status: str, done: int) -> str:
        record = TrialRecord(number=0, kind="candidate", name="abc", arch=None, result=_result(status, 0.9))
        return trial_line(record, done, 6)

    assert line("ok", 3).startswith("[3/6] abc")
    assert line("pruned", 6).startswith("[pruned] abc")
    assert line("ok", 16).startswith("[6/6] abc")


def test_the_quick_config_runs_its_baselines_and_trials_and_no_more(env: dict[str, str]) -> None:
    """``configs/quick.yaml``'s trial count, as the runner counts it (the progress line's total),
    against the file read on its own: every baseline and ``search.trials`` candidates, and no
    pruning that would add proposals."""
    path = ROOT / "configs" / "quick.yaml"
    raw = yaml.safe_load(path.read_text())
    cfg = load_config(path, overrides=["data.rows=3000"])  # the count does not depend on the rows
    runner = SearchRunner(cfg, echo=lambda s: None)
    assert runner.trial_budget() == len(raw["search"]["baselines"]) + raw["search"]["trials"]
    assert raw["search"]["pruning"] == "none"  # a pruned trial would give its slot back: more proposals
    assert runner.trial_budget() <= 6  # minutes on two cores: see the file's comment


def test_a_training_shows_its_epoch_and_step_of_a_known_total() -> None:
    """``rankitect finetune``'s line: off a terminal once a minute and at the last step, with an ETA
    at the pace of the steps so far."""
    from rankitect.search.running.progress import TrainingProgress

    clock, stream = Clock(), io.StringIO()
    progress = TrainingProgress("finetune", stream=stream, tty=False, clock=clock)
    for step in range(1, 201):  # 0.5 s a step, 100 steps an epoch
        clock.now += 0.5
        progress(step, 200, (step - 1) // 100 + 1, 2)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue() and len(lines) == 2  # at 60 s, and at the end
    assert lines[0] == "finetune epoch 2/2, step 120/200 (60%), 1:00, ETA 0:40"
    assert lines[1] == "finetune epoch 2/2, step 200/200 (100%), 1:40, ETA 0:00"


def test_a_supernet_phase_shows_its_steps_but_is_no_trial() -> None:
    clock, lines = Clock(), []
    progress = _progress(3, clock, lines)
    note = progress.phase_stepper("supernet")
    progress.started("supernet")
    clock.now += 10
    note(50, 200)
    line = progress.status(200)
    assert _counts(line)["running"] == "0" and "supernet step 50/200 10s" in line
    progress.estimate(20.0)
    assert progress.eta(clock.now) == 30.0 + 3 * 20.0  # the phase's 150 steps at its pace, then 3 trials
    progress.ended("supernet")
    assert "supernet" not in progress.status(200)
