"""Final-choice rules read back from finished searches: what each would have returned, what it
claimed, and what that model gains on test.

    python -m bench.quality.verdict_rules quality/runs/*-dnas           # every search the bench ran
    python -m bench.quality.verdict_rules OUT/runs/adult-s0-dnas --rules validation,held-out

Each argument is a search's folder as the quality bench leaves it (``--out/runs/<data>-s<seed>-<strategy>``:
the search folder under ``searches/`` holds ``pareto.csv``, ``state.json`` and the per-example
``val_losses/``, ``verdict_losses/`` and ``test_losses/`` of every trial). No model is trained:
the rules are applied to the kept losses, so several rules are compared on the same searches.

Rules (a rule returns the best baseline by validation objective unless a candidate clears it):

* ``validation``: the winner rule on the validation rows the search ranked on (one paired standard
  error; the cheapest within the noise of the best), as searches chose before held-out rows;
* ``growing``: the same with the threshold raised by ``sqrt(2 ln K)`` for ``K`` candidates better than
  the best baseline on validation (the expected maximum of ``K`` noise z-scores): more candidates
  compared, a larger gain asked for;
* ``held-out``: the verdict (:func:`~rankitect.search.judging.verdict.judge`): the best baseline and
  the 3 best candidates by validation objective judged on the held-out rows, one standard error;
* ``held-out-1``: the same with only the validation rule's own winner as finalist (a confirmation);
* ``held-out-0``: the 3 finalists, the lowest objective on the held-out rows wins (no noise rule).

Per search and rule it prints the returned model, the gain it claims (on the rows it judged on, in %
of the best baseline's NE there; negative: better) and its test NE against the best baseline's, in %
and in paired standard errors of test (``z_test``, negative: better). Then per rule: the runs where
the returned model is worse than the best baseline by more than one paired test standard error,
those where the claimed gain and the test gain differ in sign, and the mean test change per data
set.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.common import parse_args
from rankitect.eval.metrics import entropy
from rankitect.eval.objective import Objective
from rankitect.eval.result import TrialResult
from rankitect.search.judging.selection import Entrant, choose_winner, paired_gain
from rankitect.search.judging.standings import ExampleLosses
from rankitect.search.judging.verdict import judge

RULES = ("validation", "growing", "held-out", "held-out-1", "held-out-0")


def load(folder: Path) -> dict[str, Any]:
    """A search under ``folder`` (a bench run's folder or a search folder) as the rules read it."""
    folder = Path(folder)
    tables = next((found for found in (sorted(folder.glob("searches/*/pareto.csv")), sorted(folder.glob("pareto.csv")),
                                       sorted(folder.glob("*/pareto.csv"))) if found), [])
    if len(tables) != 1:
        raise SystemExit(f"{folder}: expected one search (one pareto.csv), found {len(tables)}")
    where = tables[0].parent
    table = pd.read_csv(tables[0])
    state = json.loads((where / "state.json").read_text())
    search = state.get("config", {}).get("search", {})
    losses = {s: ExampleLosses(where, s) for s in ("val", "verdict", "test")}
    ok = table[table["status"] == "ok"]
    held = {n: losses["verdict"].load(n) for n in ok["name"]}
    test = {n: losses["test"].load(n) for n in ok["name"]}
    entrants = [Entrant(r["name"], r["kind"], TrialResult(val_ne=r["val_ne"], test_ne=r["test_ne"], mflops=r["mflops"]),
                        losses["val"].load(r["name"])) for r in ok.to_dict(orient="records")]
    bases = [e for e in entrants if e.kind == "baseline"]
    target = min(bases, key=lambda e: e.result.val_ne).result.mflops if bases else None  # target_mflops: auto
    objective = Objective(target_mflops=target if search.get("target_mflops", "auto") == "auto" else None,
                          penalty=search.get("penalty", "relaxed"), weight=search.get("penalty_weight", 0.01))
    verdict = json.loads((where / "verdict.json").read_text()) if (where / "verdict.json").is_file() else {}
    return {"name": Path(folder).name, "entrants": entrants, "held": {k: v for k, v in held.items() if v is not None},
            "test": test, "objective": objective, "min_gain_se": search.get("min_gain_se", 1.0),
            "held_entropy": _held_entropy(entrants, held, verdict), "verdict": verdict}


def _held_entropy(entrants: list[Entrant], held: dict[str, Any], verdict: dict[str, Any]) -> float | None:
    """The held-out rows' label entropy, from the search's own verdict record."""
    if verdict.get("entropy"):
        return float(verdict["entropy"])
    inc, ne = verdict.get("incumbent"), verdict.get("incumbent_ne")  # a record without it: an NE and its losses
    if inc is None or ne is None or held.get(inc) is None:
        return None
    return float(np.mean(held[inc], dtype=np.float64)) / ne


def apply(rule: str, s: dict[str, Any]) -> tuple[Entrant, float | None]:
    """The model ``rule`` returns for search ``s`` and the gain it claims (NE units, positive: better)."""
    entrants, objective, z = s["entrants"], s["objective"], s["min_gain_se"]
    if rule in ("validation", "growing"):
        pick = choose_winner(entrants, objective, z)
        if rule == "growing":
            bar = objective(pick.incumbent.result)
            k = sum(e.kind != "baseline" and objective(e.result) < bar for e in entrants)
            pick = choose_winner(entrants, objective, z + math.sqrt(2 * math.log(max(k, 1))))
        inc = pick.incumbent
        return pick.winner, None if pick.winner is inc else objective(inc.result) - objective(pick.winner.result)
    finalists = {"held-out": 3, "held-out-1": 1, "held-out-0": 3}[rule]
    if rule == "held-out-1":  # the validation rule's own winner as the only finalist
        pick = choose_winner(entrants, objective, z)
        entrants = [e for e in entrants if e.kind == "baseline" or e is pick.winner]
    v = judge(entrants, s["held"], objective, entropy=s["held_entropy"], finalists=finalists,
              min_gain_se=0.0 if rule == "held-out-0" else z, val_min_gain_se=z)
    won = v.judged(v.winner)
    return v.winner, None if won is None else won.gain


def test_change(s: dict[str, Any], won: Entrant) -> tuple[float, float]:
    """``won``'s test NE against the best baseline's by validation NE: in %, and in paired standard
    errors of test (negative: better; 0 where it is that baseline)."""
    bases = [e for e in s["entrants"] if e.kind == "baseline"]
    base = min(bases, key=lambda e: e.result.val_ne)
    pct = 100 * (won.result.test_ne / base.result.test_ne - 1)
    a, b = s["test"].get(base.name), s["test"].get(won.name)
    if won is base or a is None or b is None:
        return pct, 0.0
    h = float(np.mean(a, dtype=np.float64)) / base.result.test_ne
    gain, se = paired_gain(a, b, entropy=h)
    return pct, -gain / se if se > 0 else 0.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", type=Path, help="search folders (the quality bench's --out/runs/*)")
    parser.add_argument("--rules", default=",".join(RULES))
    args = parse_args(parser, {}, argv)
    rules = args.rules.split(",")
    searches = [load(f) for f in args.folders]
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in searches:
        for rule in rules:
            if rule.startswith("held-out") and s["held_entropy"] is None:
                continue  # no rows were held out in this search
            won, claimed = apply(rule, s)
            pct, z_test = test_change(s, won)
            base_ne = min((e for e in s["entrants"] if e.kind == "baseline"), key=lambda e: e.result.val_ne).result.val_ne
            rows[rule].append({"search": s["name"], "data": s["name"].split("-s")[0], "returned": won.name,
                               "kind": won.kind, "claimed_pct": None if claimed is None else -100 * claimed / base_ne,
                               "test_pct": pct, "z_test": z_test})
    for rule in rules:
        _report(rule, rows[rule])


def _report(rule: str, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    print(f"\n== {rule} ==")
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:+.2f}"))
    worse = [r["search"] for r in rows if r["z_test"] > 1.0]
    signs = [r["search"] for r in rows if r["claimed_pct"] is not None and r["claimed_pct"] * r["test_pct"] < 0]
    claims = sum(r["claimed_pct"] is not None for r in rows)
    print(f"worse than the best baseline by more than 1 test SE: {len(worse)} of {len(rows)} {worse}")
    print(f"claimed a gain: {claims}; test change of the other sign: {len(signs)} {signs}")
    by_data: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        by_data[r["data"]].append(r["test_pct"])
    for data, values in sorted(by_data.items()):
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"  {data}: test change {statistics.mean(values):+.2f}% +- {spread:.2f} over {len(values)} "
              f"({', '.join(f'{v:+.2f}' for v in values)})")


if __name__ == "__main__":
    main()
