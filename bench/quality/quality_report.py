"""What the quality bench reads from a finished search and how it reports it (no ``main``: a part of
:mod:`bench.quality.quality_bench`).

A search is read from what it writes, as a user would read it: its folder's ``pareto.csv`` (one row
per trained baseline and candidate, the returned model marked ``winner``) and ``state.json`` (the
seconds its own clock, the one ``search.time_budget`` counts, spent). The best baseline of a data
set and seed is the ok baseline with the lowest validation NE (the model a team would ship without
looking at the test split, and what ``target_mflops: auto`` aims at), taken from that seed's ``dnas``
search, which every other strategy of the seed is compared with; a difference in % is relative test
NE against it (negative: better).

Beside what a search returned, the bench reads what it would return *at the target*: the winner by
the search's own rule (:func:`~rankitect.search.judging.selection.choose_winner` with its ``min_gain_se`` and
the per-example validation losses it kept) among its ok trials at no more than its best baseline's
FLOPs, the cap ``target_mflops: auto`` aims at. That is the search's line ``at no more than
target_mflops``, printed where its winner costs more. Under the default ``relaxed`` penalty a model
at or below the target pays nothing, so within the cap the rule ranks by validation NE alone. A
strategy whose returned model costs more than the best baseline is thus also compared where the
quality goal puts every model, at no more than the best baseline's FLOPs.

It also reads what the search's verdict claimed (``verdict.json``, :mod:`rankitect.search.judging.verdict`):
the returned model's gain over the best baseline on the held-out validation rows (``claimed``, in %
of the best baseline's NE there; 0 where the best baseline stayed), how many finalists were judged,
and what the verdict cost (the held-out scoring of every trial plus the final choice) as a share of
the search's own seconds; beside it, the returned model's test change against the best baseline in
paired standard errors of test (``z test``, from the per-example test losses the search kept).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from rankitect.eval.objective import Objective, at_most
from rankitect.eval.result import TrialResult
from rankitect.search.judging.selection import DEFAULT_MIN_GAIN_SE, Entrant, choose_winner
from rankitect.search.judging.standings import ExampleLosses

TABLE_COLUMNS = ("name", "kind", "status", "val_ne", "test_ne", "test_auc", "mflops", "winner")
CLOCK = "dnas"  # the strategy whose search time is every other strategy's time budget


def read_search(folder: Path) -> dict[str, Any]:
    """The Pareto table, run id and search seconds of the one search kept under ``folder`` (its
    ``search.output_dir``: one sub-folder per search run, named by the run id)."""
    tables = sorted(folder.glob("*/pareto.csv"))
    if len(tables) != 1:
        raise ValueError(f"{folder}: expected one search's pareto.csv, found {len(tables)}")
    table = pd.read_csv(tables[0])
    state = json.loads((tables[0].parent / "state.json").read_text())
    rows = [{c: _plain(r[c]) for c in TABLE_COLUMNS} for r in table.to_dict(orient="records")]
    min_gain_se = state.get("config", {}).get("search", {}).get("min_gain_se", DEFAULT_MIN_GAIN_SE)
    where = tables[0].parent
    verdict = json.loads((where / "verdict.json").read_text()) if (where / "verdict.json").is_file() else None
    return {"run_id": where.name, "search_s": state.get("elapsed"), "table": rows,
            "at_target": at_target(rows, ExampleLosses(where), min_gain_se), "verdict": _claim(verdict),
            "test_z": test_z(rows, ExampleLosses(where, "test"))}


def _claim(verdict: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What the search's verdict claimed: on how many held-out rows, among how many finalists, the
    returned model's gain there in % of the best baseline's NE (negative: better; 0 where the best
    baseline stayed), and the seconds the final choice took."""
    if not verdict:
        return None
    won = next((f for f in verdict.get("finalists", []) if f["name"] == verdict["winner"]), None)
    ne = verdict.get("incumbent_ne")
    claimed = -100 * won["gain"] / ne if won is not None and ne else 0.0
    seconds = (verdict.get("seconds") or 0.0) + (verdict.get("scoring_seconds") or 0.0)
    share = seconds / verdict["search_seconds"] if verdict.get("search_seconds") else None
    return {"rows": verdict.get("rows", 0), "finalists": len(verdict.get("finalists", [])),
            "claimed_pct": claimed, "seconds": seconds, "share": share}


def test_z(table: Iterable[Mapping[str, Any]], losses: ExampleLosses) -> float | None:
    """The returned model's test NE against the best baseline's in paired standard errors of test
    (negative: better; 0 where it is that baseline); ``None`` without both per-example test losses."""
    from rankitect.search.judging.selection import paired_gain

    rows = list(table)
    base, won = best_baseline(rows), returned(rows)
    if base is None or won is None:
        return None
    if won["name"] == base["name"]:
        return 0.0
    a, b = losses.load(base["name"]), losses.load(won["name"])
    if a is None or b is None or len(a) != len(b):
        return None
    h = float(a.mean(dtype="float64")) / base["test_ne"]
    gain, se = paired_gain(a, b, entropy=h)
    return -gain / se if se > 0 else 0.0


def at_target(table: Iterable[Mapping[str, Any]], losses: ExampleLosses, min_gain_se: float) -> str | None:
    """The name of the model the search's rule returns among its ok trials at no more than its best
    baseline's FLOPs (see the module docstring); ``None`` without an ok baseline."""
    base = best_baseline(table)
    if base is None:
        return None
    entrants = [Entrant(r["name"], r["kind"], TrialResult(val_ne=r["val_ne"], mflops=r["mflops"]),
                        losses.load(r["name"]))
                for r in table if r["status"] == "ok" and r["val_ne"] is not None
                and at_most(r["mflops"], base["mflops"])]
    pick = choose_winner(entrants, Objective(), min_gain_se)
    return None if pick is None else pick.winner.name


def _plain(value: Any) -> Any:
    """A JSON value: NaN becomes ``None``; numpy scalars become Python ones."""
    if hasattr(value, "item"):
        value = value.item()
    return None if isinstance(value, float) and math.isnan(value) else value


def best_baseline(table: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The ok baseline with the lowest validation NE, or ``None`` when none finished."""
    ok = [r for r in table if r["kind"] == "baseline" and r["status"] == "ok" and r["val_ne"] is not None]
    return dict(min(ok, key=lambda r: r["val_ne"])) if ok else None


def returned(table: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The row the search returned (``winner``), or ``None`` when it returned nothing."""
    return next((dict(r) for r in table if r["winner"] in (True, "True")), None)


def against(model: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """``model``'s test NE against ``base``'s: relative difference in % (negative: better) and whether
    ``model`` costs no more FLOPs (up to float rounding, as the search's objective counts it)."""
    diff = 100 * (model["test_ne"] / base["test_ne"] - 1)
    return {"diff_pct": diff, "within_flops": bool(model["mflops"] <= base["mflops"] * (1 + 1e-9))}


def references(runs: Mapping[str, Mapping[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (data, seed): the best baseline of that seed's ``dnas`` search (of another strategy's
    where the ``dnas`` search failed)."""
    refs: dict[tuple[str, int], dict[str, Any]] = {}
    for run in sorted(runs.values(), key=lambda r: r["strategy"] != CLOCK):
        key = (run["data"], run["seed"])
        base = best_baseline(run["table"])
        if key not in refs and base is not None:
            refs[key] = base
    return refs


def seed_rows(runs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per search: what it returned against its seed's best baseline, and its seconds."""
    refs, rows = references(runs), []
    for run in runs.values():
        won, base = returned(run["table"]), refs.get((run["data"], run["seed"]))
        row = {"data": run["data"], "seed": run["seed"], "strategy": run["strategy"], "wall_s": run["wall_s"],
               "search_s": run["search_s"], "time_budget": run.get("time_budget"),
               "trained": sum(r["kind"] == "candidate" and r["status"] == "ok" for r in run["table"])}
        if base is not None:
            row.update(baseline=base["name"], baseline_ne=base["test_ne"], baseline_mflops=base["mflops"])
        if won is not None:
            row.update(returned=won["name"], is_baseline=won["kind"] == "baseline", test_ne=won["test_ne"],
                       mflops=won["mflops"])
            if base is not None:
                row.update(against(won, base))
        if base is not None:  # what the search trained, read by test NE (no search can choose so)
            tried = [r["test_ne"] for r in run["table"] if r["kind"] == "candidate" and r["status"] == "ok"
                     and r["test_ne"] is not None and at_most(r["mflops"], base["mflops"])]
            if tried:
                row["trained_best_diff_pct"] = 100 * (min(tried) / base["test_ne"] - 1)
        capped = next((r for r in run["table"] if r["name"] == run.get("at_target")), None)
        if capped is not None and base is not None:
            row.update(target_returned=capped["name"], target_test_ne=capped["test_ne"],
                       target_diff_pct=against(capped, base)["diff_pct"])
        claim = run.get("verdict")
        if claim:  # what the verdict claimed on its held-out rows, against what the model does on test
            row.update(claimed_pct=claim["claimed_pct"], finalists=claim["finalists"], verdict_rows=claim["rows"],
                       verdict_s=claim["seconds"], verdict_share=claim.get("share"))
        if run.get("test_z") is not None:
            row["test_z"] = run["test_z"]
        rows.append(row)
    return sorted(rows, key=lambda r: (r["data"], r["seed"], r["strategy"] != CLOCK, r["strategy"]))


def mean_sd(values: Iterable[Any]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation of the known values (``None`` where too few)."""
    known = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    mean = statistics.fmean(known) if known else None
    return mean, statistics.stdev(known) if len(known) > 1 else None


def aggregate(rows: Iterable[Mapping[str, Any]], data: str) -> dict[str, Any]:
    """Over the seeds of ``data``: the best baseline's and each strategy's mean and spread (test NE,
    difference in %, MFLOPs, seconds), how often each returned a searched model at no more FLOPs,
    and ``dnas`` against the best of the other strategies by mean test NE; the same at the target
    (each search's pick at no more than its best baseline's FLOPs), where every seed has one; and
    the best test NE among the candidates each trained at no more than those FLOPs, which says how
    much of a gap lies in what was trained and how much in the choice among it."""
    mine = [r for r in rows if r["data"] == data]
    per_seed_base = {r["seed"]: r for r in mine if "baseline_ne" in r}
    out: dict[str, Any] = {"seeds": sorted({r["seed"] for r in mine})}
    ne, sd = mean_sd(r["baseline_ne"] for r in per_seed_base.values())
    out["best_baseline"] = {"test_ne": ne, "test_ne_sd": sd, "names": [per_seed_base[s]["baseline"] for s in
                                                                       sorted(per_seed_base)],
                            "mflops": mean_sd(r["baseline_mflops"] for r in per_seed_base.values())[0]}
    out["strategies"] = {}
    for strategy in sorted({r["strategy"] for r in mine}, key=lambda s: (s != CLOCK, s)):
        got = [r for r in mine if r["strategy"] == strategy and "test_ne" in r]
        ne, sd = mean_sd(r["test_ne"] for r in got)
        diff, diff_sd = mean_sd(r.get("diff_pct") for r in got)
        out["strategies"][strategy] = {
            "seeds": len(got), "test_ne": ne, "test_ne_sd": sd, "diff_pct": diff, "diff_pct_sd": diff_sd,
            "mflops": mean_sd(r["mflops"] for r in got)[0], "wall_s": mean_sd(r["wall_s"] for r in got)[0],
            "search_s": mean_sd(r["search_s"] for r in got)[0],
            "searched_within_flops": sum(bool(not r["is_baseline"] and r.get("within_flops")) for r in got),
            "returned_baseline": sum(bool(r["is_baseline"]) for r in got)}
        trained = [r["trained_best_diff_pct"] for r in got if "trained_best_diff_pct" in r]
        if trained and len(trained) == len(got):
            diff, diff_sd = mean_sd(trained)
            out["strategies"][strategy].update(trained_best_diff_pct=diff, trained_best_diff_pct_sd=diff_sd)
        capped = [r for r in got if "target_test_ne" in r]
        if capped and len(capped) == len(got):
            diff, diff_sd = mean_sd(r["target_diff_pct"] for r in capped)
            out["strategies"][strategy].update(target_test_ne=mean_sd(r["target_test_ne"] for r in capped)[0],
                                               target_diff_pct=diff, target_diff_pct_sd=diff_sd)
    for key, ne in (("dnas_vs_best", "test_ne"), ("dnas_vs_best_at_target", "target_test_ne")):
        others = {s: a for s, a in out["strategies"].items() if s != CLOCK and a.get(ne) is not None}
        dnas = out["strategies"].get(CLOCK)
        if others and dnas is not None and dnas.get(ne) is not None:
            best = min(others, key=lambda s: others[s][ne])
            out[key] = {"strategy": best, "diff_pct": 100 * (dnas[ne] / others[best][ne] - 1)}
    return out


def _f(value: Any, spec: str = ".4f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


SEED_COLUMNS = (("strategy", 10), ("returned", 18), ("baseline", 8), ("test NE", 8), ("MFLOPs", 8),
                ("vs best", 8), ("z test", 6), ("claimed", 8), ("final", 5), ("verdict", 7), ("<= FLOPs", 8),
                ("trained", 7), ("wall s", 7), ("search s", 8), ("budget", 8))


def _cells(r: Mapping[str, Any]) -> list[str]:
    diff, claimed = r.get("diff_pct"), r.get("claimed_pct")
    return [r["strategy"], str(r.get("returned", "(none)"))[:18], _f(r.get("is_baseline"), ""),
            _f(r.get("test_ne")), _f(r.get("mflops"), ".3f"), "-" if diff is None else f"{diff:+.2f}%",
            _f(r.get("test_z"), "+.1f"), "-" if claimed is None else f"{claimed:+.2f}%", _f(r.get("finalists"), "d"),
            "-" if r.get("verdict_share") is None else f"{100 * r['verdict_share']:.1f}%",
            _f(r.get("within_flops"), ""), str(r["trained"]), _f(r["wall_s"], ".0f"), _f(r["search_s"], ".0f"),
            r.get("time_budget") or "-"]


def _line(cells: Iterable[str]) -> str:
    return "  " + " ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, (_, w)) in enumerate(zip(cells, SEED_COLUMNS)))


def print_seeds(rows: list[dict[str, Any]], data: str) -> None:
    """The per-seed tables of ``data``: its best baseline, then each strategy's returned model."""
    for seed in sorted({r["seed"] for r in rows if r["data"] == data}):
        mine = [r for r in rows if r["data"] == data and r["seed"] == seed]
        ref = next((r for r in mine if "baseline_ne" in r), None)
        head = (f"best baseline {ref['baseline']} (by val NE): test NE {ref['baseline_ne']:.4f}, "
                f"{ref['baseline_mflops']:.3f} MFLOPs" if ref else "no baseline finished")
        print(f"\n{data}, seed {seed}: {head}")
        print(_line(name for name, _ in SEED_COLUMNS))
        for r in mine:
            print(_line(_cells(r)))


def print_summary(summary: Mapping[str, Any], data: str) -> None:
    """Mean and spread over the seeds of ``data``, and the issue's goals beside them."""
    s, base = summary, summary["best_baseline"]
    print(f"\n{data}, over seeds {', '.join(map(str, s['seeds']))} (mean, sd):")
    print(f"  {'best baseline':14s} test NE {_f(base['test_ne'])} ± {_f(base['test_ne_sd'])}  "
          f"{_f(base['mflops'], '.3f')} MFLOPs  ({', '.join(base['names'])})")
    for name, a in s["strategies"].items():
        print(f"  {name:14s} test NE {_f(a['test_ne'])} ± {_f(a['test_ne_sd'])}  {_f(a['mflops'], '.3f')} MFLOPs  "
              f"vs best baseline {_f(a['diff_pct'], '+.2f')}% ± {_f(a['diff_pct_sd'], '.2f')}  searched model at no "
              f"more FLOPs in {a['searched_within_flops']} of {a['seeds']} seeds (a baseline in "
              f"{a['returned_baseline']})  wall {_f(a['wall_s'], '.0f')} s, search {_f(a['search_s'], '.0f')} s")
    for name, a in s["strategies"].items():
        if a.get("target_diff_pct") is not None:
            print(f"  {name:14s} at no more than the best baseline's FLOPs (its rule's pick there): vs best baseline "
                  f"{a['target_diff_pct']:+.2f}% ± {_f(a['target_diff_pct_sd'], '.2f')}")
    for name, a in s["strategies"].items():
        if a.get("trained_best_diff_pct") is not None:
            print(f"  {name:14s} best candidate it trained at no more than those FLOPs, by test NE (no rule can "
                  f"choose by test): vs best baseline {a['trained_best_diff_pct']:+.2f}% ± "
                  f"{_f(a['trained_best_diff_pct_sd'], '.2f')}")
    if "dnas_vs_best" in s:
        d = s["dnas_vs_best"]
        print(f"  dnas vs the best other strategy ({d['strategy']}): {d['diff_pct']:+.2f}% test NE (goal <= +0.10%)")
    if "dnas_vs_best_at_target" in s:
        d = s["dnas_vs_best_at_target"]
        print(f"  dnas vs the best other strategy at no more than the best baseline's FLOPs ({d['strategy']}): "
              f"{d['diff_pct']:+.2f}% test NE")
    if CLOCK in s["strategies"] and s["strategies"][CLOCK]["diff_pct"] is not None:
        print(f"  dnas vs the best baseline: {s['strategies'][CLOCK]['diff_pct']:+.2f}% test NE "
              "(goal <= -0.30%, a searched model at no more FLOPs)")


def print_ranking(ranking: Mapping[str, Mapping[str, Any]]) -> None:
    """The supernet ranking table: Kendall tau per data set and seed, then mean and spread."""
    if not ranking:
        return
    print(f"\nsupernet ranking (Kendall tau, supernet-scored against stand-alone val NE):\n"
          f"  {'data':22s} {'seed':>4s} {'n':>3s} {'start':18s} {'tau shared':>10s} {'tau tuned':>9s}")
    rows = sorted(ranking.values(), key=lambda r: (r["data"], r["seed"]))
    for r in rows:
        print(f"  {r['data'][:22]:22s} {r['seed']:4d} {r['n']:3d} {r['start'][:18]:18s} "
              f"{_f(r['tau_shared'], '10.3f'):>10s} {_f(r['tau_tuned'], '9.3f'):>9s}")
    for data in sorted({r["data"] for r in rows}):
        shared, shared_sd = mean_sd(r["tau_shared"] for r in rows if r["data"] == data)
        tuned, tuned_sd = mean_sd(r["tau_tuned"] for r in rows if r["data"] == data)
        print(f"  {data}: tau {_f(shared, '.3f')} ± {_f(shared_sd, '.3f')} (supernet weights), "
              f"{_f(tuned, '.3f')} ± {_f(tuned_sd, '.3f')} (head fine-tuned)")


def plot(runs: Mapping[str, Mapping[str, Any]], data: str, path: Path) -> None:
    """Test NE against MFLOPs on ``data``: every trained candidate (grey), the baselines (squares),
    each strategy's returned model per seed, and the Pareto front over them all."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [r for r in runs.values() if r["data"] == data]
    points = [(row["mflops"], row["test_ne"], run, row) for run in mine for row in run["table"]
              if row["status"] == "ok" and row["mflops"] and row["test_ne"] is not None]
    if not points:
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    cands = [(x, y) for x, y, _, row in points if row["kind"] == "candidate"]
    if cands:
        ax.scatter(*zip(*cands), s=10, color="0.75", label="trained candidates")
    bases = [(x, y, row["name"]) for x, y, run, row in points if row["kind"] == "baseline" and run["strategy"] == CLOCK]
    for name in sorted({n for _, _, n in bases}):
        ax.scatter(*zip(*[(x, y) for x, y, n in bases if n == name]), marker="s", label=f"baseline {name}")
    for strategy in sorted({run["strategy"] for run in mine}):
        won = [(x, y) for x, y, run, row in points if run["strategy"] == strategy and row["winner"] in (True, "True")]
        if won:
            ax.scatter(*zip(*won), marker="*", s=120, edgecolor="k", label=f"{strategy} returned")
    front, best = [], math.inf
    for x, y in sorted((x, y) for x, y, _, _ in points):
        if y < best:
            front.append((x, y))
            best = y
    ax.step(*zip(*front), where="post", color="k", linewidth=0.8, label="Pareto front")
    ax.set_xscale("log")
    ax.set(xlabel="MFLOPs per example", ylabel="test NE", title=f"search quality on {data}")
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
