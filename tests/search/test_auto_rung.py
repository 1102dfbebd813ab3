"""``pruning_min_validations: auto`` (the default) places the first rung where successive halving
over the baselines keeps the best of them: the start the search builds on is never one it would stop.

Scripted curves, as on a log where the best baseline starts slowly: seven baselines report their
best validation NE so far after each of six validations; ``autoint`` is 5th of 7 after one
validation and the best after six.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rankitect.config import load_config
from rankitect.eval.result import TrialResult
from rankitect.search.judging.pruning import Rungs, first_rung
from rankitect.train.task import TrialPruned

CURVES = {  # name: best validation NE so far after validations 1..6
    "dcnv2": [0.840, 0.820, 0.815, 0.815, 0.815, 0.815],
    "deepfm": [0.850, 0.825, 0.820, 0.820, 0.820, 0.820],
    "dlrm": [0.860, 0.830, 0.825, 0.825, 0.825, 0.825],
    "wukong": [0.880, 0.840, 0.835, 0.835, 0.835, 0.835],
    "autoint": [0.900, 0.860, 0.830, 0.822, 0.816, 0.810],
    "dhen": [0.920, 0.870, 0.850, 0.845, 0.845, 0.845],
    "fuxi": [0.950, 0.900, 0.870, 0.860, 0.855, 0.855],
}
# By hand, reduction 3: a rung keeps the best 7 // 3 = 2 of the 7 values there. First rung m puts
# rungs at m, 3m, 9m, ... up to autoint's 6 validations:
#   m=1: rungs 1, 3. At 1 autoint (0.900) is 5th: stopped.
#   m=2: rungs 2, 6. At 2 autoint (0.860) is 5th: stopped.
#   m=3: rung 3. autoint (0.830) is 4th after 0.815, 0.820, 0.825: stopped.
#   m=4: rung 4. autoint (0.822) is 3rd after 0.815, 0.820: stopped.
#   m=5: rung 5. autoint (0.816) is 2nd after 0.815: kept. So the first rung is at 5 validations.
EXPECTED = 5


def test_the_slow_best_baseline_is_fifth_first_and_best_last() -> None:
    first = sorted(CURVES, key=lambda n: CURVES[n][0])
    last = sorted(CURVES, key=lambda n: CURVES[n][-1])
    assert first.index("autoint") == 4 and last[0] == "autoint"


def test_first_rung_is_where_the_best_baseline_survives() -> None:
    curves = {name: {k + 1: v for k, v in enumerate(c)} for name, c in CURVES.items()}
    assert first_rung(curves, "autoint", 3) == EXPECTED


def _baselines(rungs: Rungs, names: list[str]) -> None:
    for name in names:
        ticket = rungs.ticket(name, prune=False)
        reporter = ticket.reporter()
        for k, v in enumerate(CURVES[name], start=1):
            reporter(k, v, k == len(CURVES[name]))
        rungs.close(ticket, TrialResult(val_ne=CURVES[name][-1], mflops=1.0))


def _stopped_at(rungs: Rungs, curve: list[float]) -> int | None:
    """The validation at which a candidate with ``curve`` is stopped (None: it trains to the end)."""
    ticket = rungs.ticket("candidate")
    reporter = ticket.reporter()
    for k, v in enumerate(curve, start=1):
        try:
            reporter(k, v, k == len(curve))
        except TrialPruned:
            return k
    return None


@pytest.mark.parametrize("min_validations", ["auto", 1])
def test_the_auto_rung_keeps_a_change_that_learns_like_the_best_baseline(tmp_path: Path, min_validations) -> None:
    rungs = Rungs(None, None, tmp_path / "rungs.journal", reduction=3, min_validations=min_validations)
    _baselines(rungs, list(CURVES))
    placed = rungs.calibrate()
    like_autoint = [v - 0.002 for v in CURVES["autoint"]]  # as slow, a little better at every step
    if min_validations == "auto":
        assert placed == (EXPECTED, "autoint") and rungs.min_validations == EXPECTED
        assert _stopped_at(rungs, like_autoint) is None  # judged at 5 only, where it leads
    else:
        assert placed is None
        assert _stopped_at(rungs, like_autoint) == 1  # 0.898 is 6th of 8 after one validation


@pytest.mark.parametrize("finished", [0, 1])
def test_with_fewer_than_two_baselines_the_first_rung_stays_at_one(tmp_path: Path, finished: int) -> None:
    rungs = Rungs(None, None, tmp_path / "rungs.journal", reduction=3, min_validations="auto")
    _baselines(rungs, ["autoint"][:finished])
    assert rungs.calibrate() == (1, None) and rungs.min_validations == 1
    if finished == 0:
        assert _stopped_at(rungs, [0.5, 0.5]) is None  # the first trial ranks against nothing
    assert _stopped_at(rungs, [0.99, 0.99]) == 1  # worse than what trained before: judged at 1


def test_auto_is_the_default() -> None:
    assert load_config().search.pruning_min_validations == "auto"
