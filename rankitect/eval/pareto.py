"""The NE-versus-FLOPs Pareto front of a search: a mask, a table and a plot.

A point is on the front when no other point is at least as good on both axes and better on one
(both minimized). Equal points do not dominate each other, so duplicates are on the front together.

>>> import pandas as pd
>>> df = pd.DataFrame({"mflops": [1.0, 2.0, 2.0, 3.0, 1.0], "test_ne": [0.9, 0.8, 0.85, 0.8, 0.9]})
>>> pareto_front(df).tolist()
[True, True, False, False, True]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

COLUMNS = [
    "name", "hash", "kind", "status", "val_ne", "test_ne", "test_auc", "test_logloss", "mflops", "params",
    "objective", "on_front", "winner",
]
AXIS_LABELS = {"mflops": "MFLOPs per example", "test_ne": "test NE", "val_ne": "validation NE", "params": "parameters"}


def pareto_front(df: pd.DataFrame, x: str = "mflops", y: str = "test_ne") -> np.ndarray:
    """Boolean mask over the rows of ``df``: True where no other row dominates (minimize both).

    Rows with a missing or non-finite ``x`` or ``y`` (failed trials) are never on the front.
    """
    xs, ys = df[x].to_numpy(dtype=float), df[y].to_numpy(dtype=float)
    mask = np.zeros(len(df), dtype=bool)
    valid = np.flatnonzero(np.isfinite(xs) & np.isfinite(ys))
    order = valid[np.lexsort((ys[valid], xs[valid]))]  # by x, then y
    best_before = np.inf  # lowest y among points with a strictly smaller x
    start = 0
    while start < len(order):
        stop = start
        while stop < len(order) and xs[order[stop]] == xs[order[start]]:
            stop += 1
        group = order[start:stop]
        lowest = ys[group[0]]  # the group is sorted by y
        # a point is dominated by a same-x point with lower y, or by a smaller-x point with y <= its own
        if lowest < best_before:
            mask[group[ys[group] == lowest]] = True
        best_before = min(best_before, lowest)
        start = stop
    return mask


def _hash_of(arch: Any) -> str:
    if isinstance(arch, str):
        return arch
    h = arch.hash
    return str(h() if callable(h) else h)


def _row(name: str, h: str | None, kind: str, result: Any, objective: Callable[[Any], float] | None) -> dict:
    ok = result.status == "ok"
    score = (objective(result) if objective is not None else result.val_ne) if ok else None
    return {
        "name": name, "hash": h, "kind": kind, "status": result.status, "val_ne": result.val_ne,
        "test_ne": result.test_ne, "test_auc": result.test_auc, "test_logloss": result.test_logloss,
        "mflops": result.mflops, "params": result.params, "objective": score,
    }


def pareto_table(
    results: Iterable[tuple[Any, Any]],
    baselines: Mapping[str, Any] | Iterable[tuple[str, Any]] = (),
    *,
    objective: Callable[[Any], float] | None = None,
    x: str = "mflops",
    y: str = "test_ne",
) -> pd.DataFrame:
    """One row per candidate and baseline, sorted by ``y`` (failed trials last).

    Args:
        results: ``(architecture or genotype hash, result)`` pairs of the search's candidates.
        baselines: ``name -> result`` (or ``(name, result)`` pairs) of hand-built models.
        objective: scores an ok result (``rankitect.search.Objective``); validation NE if omitted.
        x, y: the Pareto axes, both minimized.

    Results are :class:`~rankitect.search.TrialResult` or anything with its attributes. Columns:
    ``name`` (the hash for candidates), ``hash``, ``kind`` (``candidate`` | ``baseline``), ``status``,
    the metrics, ``objective``, ``on_front`` (over candidates and baselines together) and
    ``winner`` (the ok candidate with the lowest objective, first on ties).
    """
    items = baselines.items() if isinstance(baselines, Mapping) else baselines
    rows = [_row(_hash_of(a), _hash_of(a), "candidate", r, objective) for a, r in results]
    rows += [_row(name, None, "baseline", r, objective) for name, r in items]
    df = pd.DataFrame(rows, columns=COLUMNS[:-2])
    for col in ("val_ne", "test_ne", "test_auc", "test_logloss", "mflops", "objective"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    df["params"] = pd.to_numeric(df["params"], errors="coerce").astype("Int64")
    df["on_front"] = pareto_front(df, x, y)
    df["winner"] = False
    scores = df["objective"].where((df["kind"] == "candidate") & (df["status"] == "ok"))
    if scores.notna().any():
        df.loc[scores.idxmin(), "winner"] = True
    return df.sort_values(y, kind="stable", na_position="last").reset_index(drop=True)


def plot_pareto(df: pd.DataFrame, path: str | Path, *, x: str = "mflops", y: str = "test_ne", title: str = "") -> Path:
    """Write a PNG of a :func:`pareto_table`: every point, the front as a step line, baselines
    marked and labelled, the winner highlighted. ``x`` on a log scale when all values are positive.
    """
    from matplotlib.figure import Figure  # Agg canvas, no pyplot global state

    ok = df[np.isfinite(df[x].astype(float)) & np.isfinite(df[y].astype(float))]
    cand, base = ok[ok["kind"] == "candidate"], ok[ok["kind"] == "baseline"]
    fig = Figure(figsize=(7, 4.5), dpi=120)
    ax = fig.subplots()
    ax.scatter(cand[x], cand[y], s=18, color="tab:blue", alpha=0.6, label="candidates")
    front = ok[ok["on_front"]].sort_values([x, y])
    if len(front):
        # 'post': between two front points the best reachable y is that of the cheaper one
        ax.step(front[x], front[y], where="post", color="tab:green", lw=1.5, label="Pareto front")
    ax.scatter(base[x], base[y], s=40, marker="s", color="tab:red", label="baselines")
    for _, row in base.iterrows():
        ax.annotate(str(row["name"]), (row[x], row[y]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    win = ok[ok["winner"]]
    if len(win):
        ax.scatter(win[x], win[y], s=160, marker="*", color="gold", edgecolors="black", zorder=5, label="winner")
    if len(ok) and (ok[x] > 0).all():
        ax.set_xscale("log")
    xlabel, ylabel = AXIS_LABELS.get(x, x), AXIS_LABELS.get(y, y)
    ax.set_xlabel(xlabel + (" (log scale)" if ax.get_xscale() == "log" else ""))
    ax.set_ylabel(ylabel + " (lower is better)")
    ax.set_title(title or f"{ylabel} vs {xlabel}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path
