"""The baseline phase loses nothing: kill -9 or SIGTERM during the k-th baseline (the first, the
middle one, the last; one worker and two), then ``--resume``, trains every baseline exactly once
and counts the time spent before; a time budget shorter than the baselines ends the search there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rankitect.config import load_config
from rankitect.search.running.checkpoint import SearchState, load_state
from rankitect.search.running.runner import SearchRunner
from rankitect.train.protocol import Schedule

from tests.learnable import learnable_source

from .test_runner import _children, _client

BASELINES = ["dlrm", "deepfm", "dcnv2"]
TINY = [
    f"data.source={learnable_source()}", "train.max_epochs=1", "train.batch_size=64", "train.grace_steps=0",
    "train.val_batches=2", "train.test_batches=2", "runtime.threads=1", "search.workers=1", f"search.baselines=[{','.join(BASELINES)}]",
    "search.strategy=random", "search.trials=1", "search.pruning=none", "search.target_mflops=null",
]




def _wait_for_line(proc: subprocess.Popen, done, what: str) -> list[str]:
    """Read the search's standard output until ``done(lines)``: the lines are written after the
    event they report (the estimate before the first trial; a trial's line after its record)."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if done(lines):
            return lines
    raise AssertionError(f"the search ended before {what}: {''.join(lines)[-2000:]}")


def _during_baseline(k: int):
    """``k`` from 1: the k-th baseline runs once the estimate is out (k = 1) or k - 1 are recorded."""
    if k == 1:
        return lambda lines: any(line.startswith("estimate:") for line in lines)
    return lambda lines: sum(line.startswith("[baseline]") for line in lines) >= k - 1


@pytest.mark.parametrize("k", [1, 2, 3])
def test_sigterm_during_the_kth_baseline_then_resume_trains_each_once(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, k: int,
) -> None:
    """In-process, one worker: SIGTERM arrives inside the k-th baseline's training. Every training
    that ran to its end is counted: each baseline's exactly once over both processes."""
    from rankitect.search.running import trial
    from rankitect.signals import Stopped

    real, calls, trained = trial.run_trial, [], []

    def kth_gets_sigterm(arch, *args, **kwargs):
        calls.append(arch.hash)
        if len(calls) == k:
            os.kill(os.getpid(), signal.SIGTERM)  # delivered here, in the k-th baseline's training
        out = real(arch, *args, **kwargs)
        trained.append(arch.hash)
        return out

    monkeypatch.setattr(trial, "run_trial", kth_gets_sigterm)
    runner = SearchRunner(load_config(overrides=TINY), echo=lambda s: None)
    with pytest.raises(Stopped):
        runner.run()
    before = load_state(runner.path)
    assert len(before.baselines()) == k - 1 and not before.done
    assert before.elapsed >= sum(t.result.train_seconds for t in before.trials)  # the stopped one's time too
    resumed = SearchRunner.resume(before.parent_run_id, load_config(), echo=lambda s: None)
    resumed.run()
    after = load_state(runner.path)
    _each_baseline_once(before, after, before.parent_run_id)
    for t in after.baselines():
        assert trained.count(t.arch.hash) == 1, t.name
    new = [t for t in after.trials if t.trial_id not in {b.trial_id for b in before.trials}]
    assert after.elapsed >= before.elapsed + sum(t.result.train_seconds for t in new)


@pytest.mark.slow
@pytest.mark.parametrize("signame,k,workers", [("SIGKILL", 1, 2), ("SIGKILL", 3, 1), ("SIGTERM", 2, 2)])
def test_a_kill_during_the_kth_baseline_then_resume_trains_each_once(
    env: dict[str, str], tmp_path: Path, signame: str, k: int, workers: int,
) -> None:
    cmd = [sys.executable, "-m", "rankitect", "search", *[a for a in TINY if not a.startswith("search.workers=")],
           f"search.workers={workers}"]
    # a session of its own: kill -9 takes the pool's workers with the search, as a lost machine would
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        first = proc.stdout.readline()
        parent = first.split("search run ")[1].split(":")[0]
        _wait_for_line(proc, _during_baseline(k), f"baseline {k} started")
        if signame == "SIGKILL":
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == (-signal.SIGKILL if signame == "SIGKILL" else 128 + signal.SIGTERM)
    path = Path(_client().get_run(parent).data.tags["rankitect.checkpoint"])
    before = load_state(path)
    assert not before.done and len(before.baselines()) >= k - 1 - (workers - 1)  # a pool may still run one
    assert all(t.result.train_seconds <= before.elapsed for t in before.trials)

    resumed = subprocess.run([sys.executable, "-m", "rankitect", "search", "--resume", parent], env=env,
                             cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "\r" not in resumed.stdout and "\r" not in resumed.stderr  # plain lines off a terminal
    after = load_state(path)
    _each_baseline_once(before, after, parent)
    new = [t for t in after.trials if t.trial_id not in {b.trial_id for b in before.trials}]
    # the resumed budget goes on from the time spent before, and adds the resumed trials' time
    assert after.elapsed >= before.elapsed + max(t.result.train_seconds for t in new)


def _each_baseline_once(before: SearchState, after: SearchState, parent: str) -> None:
    assert after.done and sorted(t.name for t in after.baselines()) == sorted(BASELINES)
    kept = {t.trial_id: t for t in after.trials}
    for t in before.trials:  # what was recorded before the kill is kept as it was: not trained again
        assert kept[t.trial_id].name == t.name and kept[t.trial_id].result == t.result
    finished = [r for r in _children(parent) if r.info.status != "KILLED"]
    by_name = sorted(r.info.run_name for r in finished
                     if r.data.tags["rankitect.kind"] == "baseline")
    assert by_name == sorted(BASELINES), by_name


def test_a_time_budget_shorter_than_the_baselines_ends_the_search_there(env: dict[str, str]) -> None:
    """Baselines of 60 epochs (each far longer than the budget): the first stops at the budget with
    one more validation, is recorded ok with its best validation and says it was stopped; no other
    baseline, supernet or candidate starts; the search ends soon after the budget."""
    budget = 3.0
    cfg = load_config(overrides=[*TINY, "train.max_epochs=60", "train.patience=0", f"search.time_budget={budget}"])
    lines: list[str] = []
    runner = SearchRunner(cfg, echo=lines.append)
    start = time.monotonic()
    outcome = runner.run()
    took = time.monotonic() - start
    state = load_state(runner.path)
    first = state.trials[0].result
    full = Schedule.for_data(runner.train_cfg, runner.data).total_steps
    assert [t.name for t in state.trials] == BASELINES[:1]
    assert first.status == "ok" and first.stopped == "time budget" and first.steps < full
    assert first.val_ne is not None and first.best_step <= first.steps
    run = _client().get_run(state.trials[0].run_id)
    assert run.data.tags["rankitect.stopped"] == "time budget"
    assert any("not trained" in line and "deepfm, dcnv2" in line for line in lines)
    assert any(line.startswith("time budget 0.1 min: spent") and "dlrm" in line for line in lines)
    assert outcome.spending["baselines"] <= outcome.spending["total"]
    # a full baseline takes its 60 epochs; the search ends at the budget plus a validation and the
    # scoring of the cut model (on a busy machine: within seconds more), not after its schedule
    assert took < budget + 30 and full > 20 * 32


@pytest.mark.slow
def test_a_process_waiting_for_a_killed_first_process_says_how_to_go_on(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kill -9 leaves a shared search's parent run RUNNING with no view: a second process waiting
    for the view gives up once the first one's heartbeat is older than OWNER_SILENT_S, naming the
    resume command, instead of waiting for ever."""
    from rankitect.errors import UserError
    from rankitect.search.running import shared_study
    from rankitect.search.running.shared_study import SharedStudy

    shared = [*TINY, f"search.storage=sqlite:///{tmp_path}/study.db", "search.study_name=s"]
    proc = subprocess.Popen([sys.executable, "-m", "rankitect", "search", *shared], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    study = SharedStudy(f"sqlite:///{tmp_path}/study.db", "s")
    try:
        _wait_for_line(proc, _during_baseline(1), "baseline 1 started")
        deadline = time.monotonic() + 300
        while study.silence() is None:  # the first beat is recorded through the storage, as the joiner reads it
            assert time.monotonic() < deadline and proc.poll() is None, "no heartbeat before the baselines"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert study.view() is None  # killed before it resolved anything from the baselines
    monkeypatch.setattr(shared_study, "OWNER_SILENT_S", 1.0)
    joiner = SearchRunner(load_config(overrides=shared), echo=lambda s: None)
    assert not joiner.owner
    with pytest.raises(UserError, match=r"not been heard from for \d+ s .*--resume " + joiner.state.parent_run_id):
        joiner.run()
    assert _client().get_run(joiner.state.parent_run_id).info.status == "RUNNING"  # the joiner ends nothing


def test_the_heartbeat_beats_until_its_block_ends(tmp_path: Path) -> None:
    from rankitect.search.running.shared_study import HEARTBEAT_ATTR, SharedStudy, owner_heartbeat

    study = SharedStudy(f"sqlite:///{tmp_path}/study.db", "s")
    study.open(["minimize"])
    seen = set()
    with owner_heartbeat(study, every=0.01):
        deadline = time.monotonic() + 60
        while len(seen) < 3:  # beats go on: each one later than the last
            assert time.monotonic() < deadline
            beat = study.load().user_attrs.get(HEARTBEAT_ATTR)
            if beat is not None:  # read before the first beat landed
                seen.add(beat)
        assert study.silence() is not None
    assert not any(t.name == "rankitect-owner-heartbeat" for t in threading.enumerate())
