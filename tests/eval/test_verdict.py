"""The search's closing lines from its table: the winner the table marks (the rule's choice), its
validation and test NE against the best baseline, and the best candidate when it is not the winner."""

from __future__ import annotations

from rankitect.eval.pareto import pareto_table, verdict
from rankitect.eval.result import TrialResult


def _r(val: float, test: float, mflops: float = 1.0) -> TrialResult:
    return TrialResult(val_ne=val, test_ne=test, mflops=mflops)


def _pct(a: float, b: float) -> str:
    return f"{100 * (a / b - 1):+.2f}%"


def test_a_winning_candidate_is_compared_on_validation_and_test() -> None:
    table = pareto_table([("aaaa", _r(0.70, 0.80)), ("bbbb", _r(0.75, 0.79))],
                         {"dlrm": _r(0.72, 0.82), "dcnv2": _r(0.71, 0.81)})
    text = verdict(table)  # no rule given: the lowest objective (validation NE) wins, aaaa
    assert text == (f"winner aaaa (candidate): val_ne 0.7000 ({_pct(0.70, 0.71)} vs dcnv2's 0.7100), "
                    f"test_ne 0.8000 ({_pct(0.80, 0.81)} vs dcnv2's 0.8100)")


def test_a_winner_that_loses_on_test_keeps_its_sign() -> None:
    table = pareto_table([("aaaa", _r(0.70, 0.83))], {"dlrm": _r(0.72, 0.82)})
    text = verdict(table)
    assert text.startswith("winner aaaa (candidate)") and f"({_pct(0.83, 0.82)} vs dlrm's 0.8200)" in text
    assert _pct(0.83, 0.82).startswith("+")


def test_a_baseline_winner_is_named_and_the_better_candidate_said_apart() -> None:
    # the rule kept autoint (the candidate's gain was within the noise): the lines must name autoint as
    # the winner, and the candidate with the lower objective only as the best candidate
    table = pareto_table([("7dff", _r(0.700, 0.8153)), ("beef", _r(0.720, 0.8300))],
                         {"autoint": _r(0.705, 0.8190), "dcnv2": _r(0.710, 0.8188)}, winner=("baseline", "autoint"))
    first, second = verdict(table).split("\n")
    assert first == "winner autoint (baseline): val_ne 0.7050, test_ne 0.8190; the best baseline"
    assert second.startswith("best candidate 7dff by objective, not the winner: val_ne 0.7000")
    assert f"test_ne 0.8153 ({_pct(0.8153, 0.8190)} vs autoint's 0.8190)" in second


def test_failed_and_pruned_candidates_are_never_the_winner() -> None:
    failed = TrialResult.failure("diverged")
    pruned = TrialResult.pruning("slow", val_ne=0.5, mflops=1.0, params=1, train_seconds=1.0, steps=3)
    table = pareto_table([("aaaa", failed), ("bbbb", pruned)], {"dlrm": _r(0.72, 0.82)})
    assert not table.loc[table["kind"] == "candidate", "winner"].any()  # a baseline may win, they may not
    assert verdict(table) == "winner dlrm (baseline): val_ne 0.7200, test_ne 0.8200; the best baseline; no candidate finished"
    assert verdict(pareto_table([("aaaa", failed)])) == "no model finished: there is no winner"


# --- the lines a search ends with, from the rule's own choice ---------------------------------------

def _scripted(gain_in_se: float, n: int = 4_000) -> list:
    """A scripted search: baselines autoint (the best by validation) and dcnv2, a candidate 7dff better
    than autoint on validation by exactly ``gain_in_se`` paired standard errors, a worse candidate
    beef. Per-example losses with H = 0.5, so NE = mean loss / 0.5."""
    import numpy as np

    from rankitect.search.judging.selection import Entrant

    rng = np.random.default_rng(0)
    base = rng.exponential(0.5, n)
    noise = rng.normal(0, 0.2, n)
    noise -= noise.mean()
    se = noise.std(ddof=1) / np.sqrt(n) / 0.5  # of the NE difference, the textbook paired error
    cand = base - noise - gain_in_se * se * 0.5

    def entrant(name: str, kind: str, losses: np.ndarray, test: float, mflops: float) -> Entrant:
        return Entrant(name, kind, TrialResult(val_ne=float(losses.mean()) / 0.5, test_ne=test, mflops=mflops), losses)

    return [entrant("autoint", "baseline", base, 0.8190, 0.5), entrant("dcnv2", "baseline", base + 0.01, 0.8188, 0.9),
            entrant("7dff", "candidate", cand, 0.8153, 0.7), entrant("beef", "candidate", base + 0.02, 0.8300, 0.2)]


def test_closing_lines_name_the_baseline_the_rule_kept_and_why_the_better_candidate_lost() -> None:
    from rankitect.eval.objective import Objective
    from rankitect.search.judging.selection import choose_winner

    entrants = _scripted(0.5)
    choice = choose_winner(entrants, Objective(), min_gain_se=1.0)
    first, second = choice.lines(1.0)
    # the winner is the baseline the rule kept, what export and the logged model hold; not 7dff
    assert first.startswith("winner autoint (baseline; what rankitect export and the logged model hold): ")
    assert "val/ne" in first and "test/ne 0.8190" in first and "7dff" not in first
    assert first.endswith("the best baseline by validation objective")
    # the better candidate by objective, apart, with why it lost: a gain within the noise
    assert second.startswith("best candidate 7dff by validation objective: ")
    assert f"test/ne 0.8153 ({100 * (0.8153 / 0.8190 - 1):+.2f}%)" in second
    assert second.endswith("not the winner: better than the best baseline autoint on validation by 0.50 "
                           "standard errors only (search.min_gain_se = 1)")


def test_closing_lines_of_a_winning_candidate_compare_it_with_the_best_baseline() -> None:
    from rankitect.eval.objective import Objective
    from rankitect.search.judging.selection import choose_winner

    entrants = _scripted(3.0)
    choice = choose_winner(entrants, Objective(), min_gain_se=1.0)
    (line,) = choice.lines(1.0)  # the winner is the best candidate: one line
    val_w, val_b = entrants[2].result.val_ne, entrants[0].result.val_ne
    assert line.startswith(f"winner 7dff (candidate; what rankitect export and the logged model hold): "
                           f"val/ne {val_w:.4f} ({100 * (val_w / val_b - 1):+.2f}%), "
                           f"test/ne 0.8153 ({100 * (0.8153 / 0.8190 - 1):+.2f}%), 0.7 MFLOPs vs autoint's")
    assert line.endswith("better on validation objective than the best baseline by 3.00 standard errors")


def test_closing_lines_say_when_no_candidate_beat_the_best_baseline_on_validation() -> None:
    from rankitect.eval.objective import Objective
    from rankitect.search.judging.selection import choose_winner

    entrants = [e for e in _scripted(0.5) if e.name != "7dff"]
    first, second = choose_winner(entrants, Objective(), min_gain_se=1.0).lines(1.0)
    assert first.startswith("winner autoint (baseline;")
    assert second.startswith("best candidate beef by validation objective:")
    assert second.endswith("not the winner: its validation objective (FLOPs penalty included) is not below "
                           "the best baseline's")


def test_a_winner_off_the_test_front_is_explained_by_the_model_that_beats_it() -> None:
    from rankitect.eval.pareto import front_note

    # the rule kept dlrm (chosen on validation); on test the cheaper cccc beats it: off the front
    table = pareto_table([("cccc", _r(0.73, 0.80, mflops=0.5)), ("dddd", _r(0.74, 0.79, mflops=0.8))],
                         {"dlrm": _r(0.72, 0.82, mflops=1.0)}, winner=("baseline", "dlrm"))
    assert not table.loc[table["winner"], "on_front"].item()
    note = front_note(table)
    assert note.startswith("the winner dlrm is off the test_ne front (cccc: test_ne 0.8000 at 0.5 MFLOPs")
    assert "chosen on validation" in note
    on = pareto_table([("cccc", _r(0.70, 0.80, mflops=0.5))], {"dlrm": _r(0.72, 0.82, mflops=1.0)})
    assert on.loc[on["winner"], "on_front"].item() and front_note(on) is None
