"""The search's closing sentence: the winner's relative test NE change to the best baseline."""

from __future__ import annotations

from rankitect.eval.pareto import pareto_table, verdict
from rankitect.search.base import TrialResult


def _r(val: float, test: float, mflops: float = 1.0) -> TrialResult:
    return TrialResult(val_ne=val, test_ne=test, mflops=mflops)


def test_winner_better_than_the_best_baseline_has_a_minus_sign() -> None:
    table = pareto_table([("aaaa", _r(0.70, 0.80)), ("bbbb", _r(0.75, 0.79))],
                         {"dlrm": _r(0.72, 0.82), "dcnv2": _r(0.71, 0.81)})
    text = verdict(table)
    change = 100 * (0.80 / 0.81 - 1)  # the winner is picked by validation NE: aaaa
    assert text == f"winner aaaa: test_ne 0.8000, {change:+.2f}% vs the best baseline dcnv2 (0.8100)"
    assert text.startswith("winner aaaa") and "-1.23%" in text


def test_no_candidate_beat_the_best_baseline_is_said_plainly() -> None:
    table = pareto_table([("aaaa", _r(0.70, 0.83))], {"dlrm": _r(0.72, 0.82)})
    text = verdict(table)
    assert text.startswith("no candidate beat the best baseline")
    assert f"{100 * (0.83 / 0.82 - 1):+.2f}%" in text and text.count("+") == 1


def test_failed_and_pruned_candidates_are_never_the_winner() -> None:
    failed = TrialResult.failure("diverged")
    pruned = TrialResult.pruning("slow", val_ne=0.5, mflops=1.0, params=1, train_seconds=1.0, steps=3)
    table = pareto_table([("aaaa", failed), ("bbbb", pruned)], {"dlrm": _r(0.72, 0.82)})
    assert not table.loc[table["kind"] == "candidate", "winner"].any()  # a baseline may win, they may not
    assert verdict(table) == "no candidate finished: nothing to compare with the baselines"
