"""The running best of :class:`~rankitect.search.judging.standings.Standings` against the rule applied from
scratch: after every trial, the winner that decides what to keep is the winner of
:func:`~rankitect.search.judging.selection.choose_winner` over every trial so far, every loss loaded; the
kept names are every baseline, the ``keep_top_k`` best ok candidates and that winner; and a loss
file is read only for a trial that can win, once."""

from __future__ import annotations

import numpy as np
import pytest

from rankitect.eval.objective import Objective
from rankitect.eval.result import TrialResult
from rankitect.search.running.checkpoint import TrialRecord
from rankitect.search.judging.selection import Entrant, choose_winner
from rankitect.search.judging.standings import Standings, ExampleLosses

ROWS, H = 400, 0.5  # validation rows; the split's entropy (NE = mean loss / H)


class CountingLosses(ExampleLosses):
    """ExampleLosses that notes every file read from disk (not from its memory)."""

    def __init__(self, folder) -> None:
        super().__init__(folder)
        self.read: list[str] = []

    def load(self, name: str) -> np.ndarray | None:
        if name not in self._cache and self._path(name).is_file():
            self.read.append(name)
        return super().load(name)


def _trials(rng: np.random.Generator, store: ExampleLosses) -> list[TrialRecord]:
    """Three baselines, then candidates around them: some far better, some within the noise, some
    failed; each ok one's losses saved as a search saves them."""
    common = rng.exponential(H, ROWS)
    spec = [("baseline", 0.0)] * 3 + [("candidate", s) for s in rng.choice([-0.05, -0.048, -0.046, -0.01, 0.0, None], 24)]
    out = []
    for i, (kind, shift) in enumerate(spec):
        name = f"b{i}" if kind == "baseline" else f"c{i}"
        if shift is None:
            result = TrialResult.failure("diverged")
        else:
            losses = np.clip(common + shift + rng.normal(0, 0.03, ROWS), 1e-3, None).astype(np.float32)
            store.save(name, losses)
            result = TrialResult(val_ne=float(np.mean(losses, dtype=np.float64)) / H,
                                 mflops=float(rng.choice([0.25, 0.5, 1.0, 2.0])))
        out.append(TrialRecord(number=i, kind=kind, name=name, arch=None, result=result))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_running_best_is_the_winner_of_every_trial_so_far(tmp_path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    trials = _trials(rng, ExampleLosses(tmp_path))
    objective, k = Objective(target_mflops=1.0, weight=0.01), 2
    losses = CountingLosses(tmp_path)
    standings = Standings(objective, 1.0, losses)
    for n in range(1, len(trials) + 1):
        seen = trials[:n]
        best = standings.update(seen)
        every = [Entrant(t.name, t.kind, t.result, ExampleLosses(tmp_path).load(t.name)) for t in seen]
        reference = choose_winner(every, objective, 1.0)
        assert (best and best.winner.name) == (reference and reference.winner.name), n
        ok = sorted((t for t in seen if t.kind == "candidate" and t.result.ok), key=lambda t: objective(t.result))
        kept = {t.name for t in seen if t.kind == "baseline"} | {t.name for t in ok[:k]}
        if reference is not None and reference.winner.kind == "candidate":
            kept.add(reference.winner.name)
        assert standings.kept(seen, k) == kept, n
    bar = min(objective(t.result) for t in trials if t.kind == "baseline")
    can_win = {t.name for t in trials if t.result.ok and (t.kind == "baseline" or objective(t.result) < bar)}
    assert set(losses.read) <= can_win and len(losses.read) == len(set(losses.read))
