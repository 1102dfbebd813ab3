"""Strategies sharing one Optuna RDB study (what several search processes do), on SQLite."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from rankitect.search import build_strategy
from rankitect.search.running.shared_study import SharedStudy
from tests.search.toy import ToySpace, toy_result


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    # one database per module: creating its tables is the slow part
    return f"sqlite:///{tmp_path_factory.mktemp('optuna')}/search.db"


def interleave(strategies, rounds):
    hashes = []
    for _ in range(rounds):
        archs = [(s, s.ask()) for s in strategies]  # every process has one trial in flight
        hashes += [a.hash for _, a in archs]
        for s, a in archs:
            s.tell(a, toy_result(a))
    return hashes


def test_evolution_processes_share_history_and_population(storage):
    first = build_strategy("evolution", ToySpace(), seed=0, population=4, sample_size=2,
                           shared=SharedStudy(storage, "evo"))
    hashes = interleave([first], 4)
    space = ToySpace()
    second = build_strategy("evolution", space, seed=1, population=4, sample_size=2,
                            shared=SharedStudy(storage, "evo"))
    second.ask()  # four trials finished elsewhere: the population is full, so this is a child
    assert space.mutated_from and set(a.hash for a in space.mutated_from) <= set(hashes)
    more = interleave([first, second], 4)
    assert len(set(hashes + more)) == len(hashes + more)


def test_tpe_and_random_share_one_study_without_duplicates(storage):
    tpe = build_strategy("tpe", ToySpace(), seed=0, n_startup_trials=3, shared=SharedStudy(storage, "mixed"))
    rnd = build_strategy("random", ToySpace(), seed=0, shared=SharedStudy(storage, "mixed"))
    hashes = interleave([tpe, rnd], 6)
    assert len(set(hashes)) == len(hashes)
    assert len({t.number for t in tpe.study.trials}) >= 12


def test_state_dict_keeps_only_the_running_trials_and_resumes(storage):
    nsga = build_strategy("nsga2", ToySpace(), seed=0, population_size=4, shared=SharedStudy(storage, "nsga"))
    interleave([nsga], 3)
    running = nsga.ask()
    state = json.loads(json.dumps(nsga.state_dict()))
    assert state["study"] is None and list(state["pending"]) == [running.hash]
    resumed = build_strategy("nsga2", ToySpace(), seed=0, population_size=4, shared=SharedStudy(storage, "nsga"))
    resumed.load_state_dict(state)
    result = toy_result(running)
    resumed.tell(running, result)
    trial = resumed.study.trials[state["pending"][running.hash]]
    assert trial.user_attrs["genotype_hash"] == running.hash
    assert trial.values == ([result.val_ne, result.mflops] if result.ok else None)
    assert trial.state.name == ("COMPLETE" if result.ok else "FAIL")


def test_a_study_with_other_directions_or_no_name_is_refused(storage):
    build_strategy("tpe", ToySpace(), seed=0, shared=SharedStudy(storage, "single"))
    with pytest.raises(ValueError, match="directions"):
        build_strategy("nsga2", ToySpace(), seed=0, shared=SharedStudy(storage, "single"))
    with pytest.raises(ValueError, match="study_name"):
        build_strategy("evolution", ToySpace(), seed=0, shared=SharedStudy(storage, None))


@pytest.mark.parametrize("name", ["random", "evolution"])
def test_two_processes_proposing_one_genotype_at_once_keep_one(storage, name, monkeypatch):
    options = {"population": 4, "sample_size": 2} if name == "evolution" else {}
    first = build_strategy(name, ToySpace(), seed=5, shared=SharedStudy(storage, f"race-{name}"), **options)
    second = build_strategy(name, ToySpace(), seed=5, shared=SharedStudy(storage, f"race-{name}"), **options)
    # the second looked at the study before the first recorded its proposal: a stale view
    monkeypatch.setattr(second.history, "seen", lambda: set())
    a = first.ask()
    b = second.ask()  # same seed, so it drew the same genotype first, was refused, and drew again
    assert a.hash != b.hash
    import optuna

    trials = optuna.load_study(study_name=f"race-{name}", storage=storage).get_trials()
    dupes = [t for t in trials if "duplicate_of" in t.user_attrs]
    assert len(dupes) == 1 and dupes[0].user_attrs["genotype_hash"] == a.hash
    assert dupes[0].state == optuna.trial.TrialState.FAIL


@pytest.mark.parametrize("name", ["random", "evolution", "tpe"])
def test_a_proposal_past_the_shared_budget_is_failed_and_never_counted(storage, name: str) -> None:
    """Two processes with the last trial of the budget in sight both propose: the earlier
    proposal keeps the slot, the later one is marked over budget, failed, and counts nowhere."""
    from rankitect.search._optuna import OVER_BUDGET_ATTR, import_optuna
    from rankitect.search.running.shared_study import claim_budget, shared_trial_count

    study_name = f"budget-{name}"
    first = build_strategy(name, ToySpace(), seed=0, shared=SharedStudy(storage, study_name))
    second = build_strategy(name, ToySpace(), seed=1, shared=SharedStudy(storage, study_name))
    a = first.ask()
    assert claim_budget(storage, study_name, a.hash, budget=2)
    b, c = first.ask(), second.ask()  # both saw one trial taken, so both proposed the second
    assert claim_budget(storage, study_name, b.hash, budget=2)
    assert not claim_budget(storage, study_name, c.hash, budget=2)
    assert shared_trial_count(storage, study_name) == 2
    trials = import_optuna().load_study(study_name=study_name, storage=storage).get_trials()
    over = [t for t in trials if OVER_BUDGET_ATTR in t.user_attrs]
    assert [t.user_attrs["genotype_hash"] for t in over] == [c.hash] and over[0].state.name == "FAIL"


def test_a_claim_judges_its_own_proposal_not_a_duplicate_still_being_marked(storage) -> None:
    """A second process proposes the same genotype a moment after the first: until it marks its
    trial a duplicate and fails it, two running trials hold the hash. The first process's claim is
    judged on its own (earlier) trial, within the budget, and leaves the other process's trial to
    it (judging that one past the budget raced with its failure: UpdateFinishedTrialError); so does
    giving back the first process's running trials when it is stopped."""
    from rankitect.search import _optuna
    from rankitect.search.running.shared_study import claim_budget, release_running

    study_name = "claim-own"
    space = ToySpace()
    study = SharedStudy(storage, study_name).open(["minimize"])
    arch = space.decode(space.sample(np.random.default_rng(0)))
    sample = space.encode(arch)
    ours = _optuna.record_trial(study, space, sample, {_optuna.HASH_ATTR: arch.hash})
    theirs = _optuna.record_trial(study, space, sample, {_optuna.HASH_ATTR: arch.hash})  # not yet marked
    def stored() -> dict[int, Any]:
        return {t.number: t for t in _optuna.import_optuna().load_study(study_name=study_name, storage=storage).get_trials()}

    assert claim_budget(storage, study_name, arch.hash, budget=1)  # ours is the first trial of one
    trials = stored()
    assert trials[ours.number].state.name == "RUNNING"
    assert trials[theirs.number].state.name == "RUNNING" and _optuna.OVER_BUDGET_ATTR not in trials[theirs.number].user_attrs
    release_running(storage, study_name, [arch.hash], "SIGTERM")  # our process is stopped: ours alone is given back
    trials = stored()
    assert trials[ours.number].state.name == "FAIL" and trials[ours.number].user_attrs[_optuna.STOPPED_ATTR] == "SIGTERM"
    assert trials[theirs.number].state.name == "RUNNING" and _optuna.STOPPED_ATTR not in trials[theirs.number].user_attrs
