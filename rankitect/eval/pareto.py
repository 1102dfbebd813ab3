"""The NE-versus-FLOPs Pareto front of a search: a mask, a table and a plot.

A point is on the front when no other point is at least as good on both axes and better on one
(both minimized). Equal points do not dominate each other, so duplicates are on the front together.

>>> import pandas as pd
>>> df = pd.DataFrame({"mflops": [1.0, 2.0, 2.0, 3.0, 1.0], "test_ne": [0.9, 0.8, 0.85, 0.8, 0.9]})
>>> pareto_front(df).tolist()
[True, True, False, False, True]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLUMNS = [
    "name", "hash", "kind", "status", "val_ne", "test_ne", "test_auc", "test_logloss", "mflops", "params",
    "objective", "on_front", "winner",
]
UNITS = {"mflops": "MFLOPs", "params": "parameters"}
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
    winner: tuple[str, str] | None = None,
) -> pd.DataFrame:
    """One row per candidate and baseline, sorted by ``y`` (failed trials last).

    Args:
        results: ``(architecture or genotype hash, result)`` pairs of the search's candidates.
        baselines: ``name -> result`` (or ``(name, result)`` pairs) of hand-built models.
        objective: scores an ok result (:class:`~rankitect.eval.objective.Objective`); validation NE if omitted.
        x, y: the Pareto axes, both minimized.
        winner: ``(kind, name)`` of the row to mark as the winner, chosen by the caller (a search
            weighs the noise of validation: :func:`rankitect.search.judging.selection.choose_winner`).

    Results are :class:`~rankitect.eval.result.TrialResult` or anything with its attributes. Columns:
    ``name`` (the hash for candidates), ``hash``, ``kind`` (``candidate`` | ``baseline``), ``status``,
    the metrics, ``objective``, ``on_front`` (over candidates and baselines together) and
    ``winner`` (``winner``'s row; without it, the ok candidate or baseline with the lowest objective,
    first on ties: a search whose candidates all lose to a hand-built model returns that model).
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
    scores = df["objective"].where(df["status"] == "ok")  # baselines compete like any candidate
    if winner is not None:
        df.loc[(df["kind"] == winner[0]) & (df["name"] == winner[1]), "winner"] = True
    elif scores.notna().any():
        df.loc[scores.idxmin(), "winner"] = True
    return df.sort_values(y, kind="stable", na_position="last").reset_index(drop=True)


def verdict(df: pd.DataFrame) -> str:
    """The closing lines of a search, from its table: the winner (the row marked ``winner``, what
    the search's rule chose and what it exports) with its validation and test NE and their relative
    change against the best baseline (the ok baseline with the lowest objective, the one the rule
    measures candidates against); then, when the best candidate by objective is not the winner, that
    candidate on a line of its own.

    ``df`` is a :func:`pareto_table`.
    """
    ok = df[df["status"] == "ok"]
    cands, bases, win = ok[ok["kind"] == "candidate"], ok[ok["kind"] == "baseline"], ok[ok["winner"]]
    if not len(win):
        return "no model finished: there is no winner"
    row = win.iloc[0]
    base = bases.loc[bases["objective"].idxmin()] if len(bases) else None
    head = f"winner {row['name']} ({row['kind']}): "
    if base is None:
        lines = [head + _versus(row, None) + " (no baseline to compare with)"]
    elif base["name"] == row["name"] and row["kind"] == "baseline":
        lines = [head + _versus(row, None) + "; the best baseline" + ("" if len(cands) else "; no candidate finished")]
    else:
        lines = [head + _versus(row, base)]
    if len(cands):
        top = cands.loc[cands["objective"].idxmin()]
        if not (row["kind"] == "candidate" and top["name"] == row["name"]):
            lines.append(f"best candidate {top['name']} by objective, not the winner: {_versus(top, row)}")
    return "\n".join(lines)


def front_note(df: pd.DataFrame, x: str = "mflops", y: str = "test_ne") -> str | None:
    """Why the winner of a :func:`pareto_table` is off its front, or None when it is on it (or there
    is none): the winner is chosen on validation (and may be the cheapest within the noise of a
    better one), the front is drawn on ``y``, so a model may beat it there; names the one that does
    at the least cost."""
    win = df[df["winner"] & (df["status"] == "ok")]
    if not len(win) or bool(win.iloc[0]["on_front"]):
        return None
    row = win.iloc[0]
    ok = df[(df["status"] == "ok") & (df[x] <= row[x]) & (df[y] < row[y])]
    if not len(ok):
        return None
    by = ok.sort_values([x, y]).iloc[0]
    return (f"the winner {row['name']} is off the {y} front ({by['name']}: {y} {by[y]:.4f} at {by[x]:.4g} "
            f"{UNITS.get(x, x)} beats it there): the winner is chosen on validation, the front is drawn on {y}")


def _versus(row: pd.Series, ref: pd.Series | None) -> str:
    """``row``'s validation and test NE, with their relative change against ``ref``'s."""
    parts = []
    for col in ("val_ne", "test_ne"):
        text = f"{col} {row[col]:.4f}"
        if ref is not None and np.isfinite(ref[col]) and ref[col] != 0:
            text += f" ({100 * (row[col] / ref[col] - 1):+.2f}% vs {ref['name']}'s {ref[col]:.4f})"
        parts.append(text)
    return ", ".join(parts)


FIGSIZE, DPI = (9.0, 5.4), 120  # the PNG is FIGSIZE * DPI pixels: 1080 x 648
AXES_RECT = (0.085, 0.105, 0.66, 0.77)  # left, bottom, width, height; the legend sits to the right
# Label offsets in points, nearest first: at each distance, beside the point before above or below
# it (a label level with its point reads as its own), then 8 in-between directions.
_ANGLES = (0, 180, 45, -45, 135, -135, 90, -90, 22.5, -22.5, 157.5, -157.5, 67.5, -67.5, 112.5, -112.5)
LABEL_OFFSETS = [(round(r * math.cos(math.radians(a)), 1), round(r * math.sin(math.radians(a)), 1))
                 for r in (6, 13, 22, 34, 50, 70, 95, 125) for a in _ANGLES]
NEAR = 6  # offsets up to this many points need no leader line


def plot_pareto(
    df: pd.DataFrame, path: str | Path, *, x: str = "mflops", y: str = "test_ne", title: str = "",
    floor: float | None = None,
) -> Path:
    """Write :func:`pareto_figure` as a PNG of ``FIGSIZE * DPI`` pixels (1080 x 648); folders are created."""
    fig = pareto_figure(df, x=x, y=y, title=title, floor=floor)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=DPI)
    return path


def pareto_figure(
    df: pd.DataFrame, *, x: str = "mflops", y: str = "test_ne", title: str = "", floor: float | None = None,
) -> Figure:
    """The plot of a :func:`pareto_table` as a matplotlib ``Figure`` on its own Agg canvas.

    Every candidate is a point, the front (over candidates and baselines) a step line, baselines are
    labelled squares, the winner a star annotated with its ``y``, ``x`` and its change against the
    best baseline. Pruned and failed trials (no ``y``) are counted apart in the subtitle and, where
    their ``x`` is known, marked along the top edge, each with its own legend entry. ``x`` is on a log scale when all values are positive. Labels are nudged
    apart so that none covers another label, a point or the front.

    Args:
        df: a :func:`pareto_table`.
        x, y: the columns on the axes, as in :func:`pareto_table`.
        title: the first title line, e.g. the strategy and the data; counts follow below it.
        floor: the best reachable ``y`` (the Bayes-optimal NE of synthetic data), drawn dashed.

    >>> from types import SimpleNamespace
    >>> df = pareto_table([("aaaa", SimpleNamespace(status="ok", val_ne=0.8, test_ne=0.81, test_auc=0.7,
    ...                     test_logloss=0.5, mflops=1.5, params=10))])
    >>> fig = pareto_figure(df, title="random search on synthetic", floor=0.75)
    >>> [t.get_text().splitlines()[1] for t in fig.axes[0].texts]
    ['test NE 0.8100, 1.5 MFLOPs']
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # an Agg canvas of its own, no pyplot global state

    xs, ys = df[x].to_numpy(dtype=float), df[y].to_numpy(dtype=float)
    finite = np.isfinite(xs) & np.isfinite(ys)
    ok, failed = df[finite], df[~finite]
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_axes(AXES_RECT)
    _draw_points(ax, ok, x, y)
    if floor is not None:
        ax.axhline(floor, color="0.3", ls="--", lw=1, label=f"Bayes-optimal {AXIS_LABELS.get(y, y)} ({floor:.4f})")
    _set_axes(ax, ok, x, y, floor, xs[np.isfinite(xs)])
    known = failed[np.isfinite(failed[x].to_numpy(dtype=float))]
    # trials without a y, a mark at the top edge at their x: stopped early by the search (pruned, a
    # trial that was doing well enough to run but not to finish) or failed (diverged, crashed)
    for status, marker, color in (("pruned", "|", "tab:orange"), ("failed", "x", "0.45")):
        some = known[_stopped(known) == status]
        if len(some):
            ax.scatter(some[x], np.full(len(some), 0.965), transform=ax.get_xaxis_transform(), marker=marker,
                       s=22, color=color, clip_on=False, label=f"{status} (no {AXIS_LABELS.get(y, y)})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=8, frameon=False)
    fig.suptitle(title or f"{AXIS_LABELS.get(y, y)} vs {AXIS_LABELS.get(x, x)}", x=0.02, ha="left", fontsize=12)
    fig.text(0.02, 0.905, _summary(df, ok, failed), fontsize=8.5, color="0.3")
    _label_points(ax, ok, x, y)
    return fig


def _draw_points(ax: Any, ok: pd.DataFrame, x: str, y: str) -> None:
    cand, base = ok[ok["kind"] == "candidate"], ok[ok["kind"] == "baseline"]
    ax.scatter(cand[x], cand[y], s=20, color="tab:blue", alpha=0.65, lw=0, label="candidates", zorder=3)
    front = ok[ok["on_front"]].sort_values([x, y])
    if len(front):
        # 'post': between two front points the best reachable y is that of the cheaper one
        ax.step(front[x], front[y], where="post", color="tab:green", lw=1.4, alpha=0.8, label="Pareto front",
                zorder=2)
    ax.scatter(base[x], base[y], s=42, marker="s", color="tab:red", edgecolors="white", lw=0.6,
               label="hand-designed baselines", zorder=4)
    win = ok[ok["winner"]]
    if len(win):
        ax.scatter(win[x], win[y], s=220, marker="*", color="gold", edgecolors="black", lw=0.8, label="winner",
                   zorder=5)


def _set_axes(ax: Any, ok: pd.DataFrame, x: str, y: str, floor: float | None, all_x: np.ndarray) -> None:
    """Limits with room for labels, a log x axis with plain tick labels, named axes."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ys = ok[y].to_numpy(dtype=float).tolist() + ([floor] if floor is not None else [])
    if ys:
        lo, hi = min(ys), max(ys)
        pad = max(hi - lo, 1e-3 * max(abs(hi), 1.0)) * 0.12
        ax.set_ylim(lo - pad, hi + pad)
    if len(all_x) and (all_x > 0).all():
        lo, hi = float(all_x.min()), float(all_x.max())
        ratio = max(hi / lo, 1.5) ** 0.08  # the same share of room on both sides of a log axis
        ax.set_xscale("log")
        ax.set_xlim(lo / ratio, hi * ratio)
        decades = np.log10(hi / lo)
        subs = (1.0,) if decades > 3 else (1.0, 2.0, 5.0) if decades > 1.5 else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
        ax.xaxis.set_major_locator(LogLocator(subs=subs))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    xlabel, ylabel = AXIS_LABELS.get(x, x), AXIS_LABELS.get(y, y)
    ax.set_xlabel(xlabel + (" (log scale)" if ax.get_xscale() == "log" else ""))
    ax.set_ylabel(ylabel + " (lower is better)")
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", axis="x", alpha=0.1)


def _stopped(rows: pd.DataFrame) -> pd.Series:
    """``pruned`` or ``failed`` for each row without a point (an ok row missing a value is failed)."""
    return rows["status"].where(rows["status"] == "pruned", "failed")


def _summary(df: pd.DataFrame, ok: pd.DataFrame, failed: pd.DataFrame) -> str:
    n_cand = int((df["kind"] == "candidate").sum())
    stopped = _stopped(failed[failed["kind"] == "candidate"])
    n_pruned, n_fail = int((stopped == "pruned").sum()), int((stopped == "failed").sum())
    n_base = int((ok["kind"] == "baseline").sum())
    counts = ", ".join([f"{n_pruned} pruned"] * (n_pruned > 0) + [f"{n_fail} failed"])
    text = (f"{n_cand} candidate{'s' * (n_cand != 1)} ({counts}), {n_base} baseline{'s' * (n_base != 1)}, "
            f"{int(ok['on_front'].sum())} on the front")
    bad_base = failed.loc[failed["kind"] == "baseline", "name"].astype(str).tolist()
    return text + (f"; failed baselines: {', '.join(bad_base)}" if bad_base else "")


def _winner_text(ok: pd.DataFrame, x: str, y: str) -> str | None:
    win = ok[ok["winner"]]
    if not len(win):
        return None
    row = win.iloc[0]
    text = f"winner {row['name']}\n{AXIS_LABELS.get(y, y)} {row[y]:.4f}, {row[x]:.3g} {UNITS.get(x, x)}"
    base = ok[ok["kind"] == "baseline"]
    if len(base):  # relative change, as NE gains are reported (DHEN: -0.27%)
        best = base.loc[base[y].idxmin()]
        text += f"\n{100 * (row[y] / best[y] - 1):+.2f}% vs best baseline {best['name']}"
    return text


def _label_points(ax: Any, ok: pd.DataFrame, x: str, y: str) -> None:
    """Annotate the winner, then every baseline, each at the nearest offset that stays inside the
    axes and covers no point and no earlier label (fewest overlaps when none is free)."""
    renderer = ax.figure.canvas.get_renderer()
    taken = _obstacles(ax, ok, x, y)
    labels: list[tuple[tuple[float, float], str, dict]] = []
    text = _winner_text(ok, x, y)
    if text is not None:
        row = ok[ok["winner"]].iloc[0]
        box = dict(boxstyle="round,pad=0.3", fc="lightyellow", ec="0.5", lw=0.6, alpha=0.9)
        style = dict(fontsize=8, multialignment="left", bbox=box)
        labels.append(((row[x], row[y]), text, style))
    for _, row in ok[ok["kind"] == "baseline"].sort_values(y).iterrows():
        labels.append(((row[x], row[y]), str(row["name"]), dict(fontsize=8.5, color="darkred")))
    for xy, text, style in labels:
        ann = ax.annotate(text, xy, textcoords="offset points", xytext=(0, 0), zorder=6,
                          arrowprops=dict(arrowstyle="-", color="0.35", lw=0.7, shrinkA=0, shrinkB=5), **style)
        taken.append(_place(ann, renderer, ax.bbox.extents, taken))


def _obstacles(ax: Any, ok: pd.DataFrame, x: str, y: str) -> list[tuple]:
    """Pixel boxes (x0, y0, x1, y1) a label must not cover: every marker and the front's segments."""
    to_px, pt = ax.transData.transform, ax.figure.dpi / 72
    boxes = []
    for (px, py), win in zip(to_px(ok[[x, y]].to_numpy(dtype=float)) if len(ok) else [], ok["winner"]):
        r = (9 if win else 4) * pt  # the star is drawn far larger than the dots and squares
        boxes.append((px - r, py - r, px + r, py + r))
    front = to_px(ok.loc[ok["on_front"], [x, y]].sort_values([x, y]).to_numpy(dtype=float)) if len(ok) else []
    for (x0, y0), (x1, y1) in zip(front[:-1], front[1:]):
        boxes.append((x0, y0 - pt, x1, y0 + pt))  # the step: along at the cheaper point's y ...
        boxes.append((x1 - pt, min(y0, y1), x1 + pt, max(y0, y1)))  # ... then down to the next point
    return boxes


def _place(ann: Any, renderer: Any, frame: Any, taken: list[tuple]) -> tuple:
    """Move ``ann`` to the first of :data:`LABEL_OFFSETS` that stays inside ``frame`` and covers
    nothing in ``taken``, else to the one with the fewest clashes; returns its pixel box."""
    tried = []
    for offset in LABEL_OFFSETS:
        box = _move(ann, offset, renderer)
        inside = frame[0] <= box[0] and frame[1] <= box[1] and box[2] <= frame[2] and box[3] <= frame[3]
        # a label cut by the frame is worse than any number of overlaps
        clashes = sum(_overlap(box, other) for other in taken) + (0 if inside else 1000)
        tried.append((clashes, offset))
        if clashes == 0:
            break
    offset = min(tried, key=lambda t: t[0])[1]  # the first of the least clashing, nearest first
    box = _move(ann, offset, renderer)
    ann.arrow_patch.set_visible(max(abs(offset[0]), abs(offset[1])) > NEAR)  # a leader only when apart
    return box


def _move(ann: Any, offset: tuple[float, float], renderer: Any) -> tuple:
    """Put ``ann`` at ``offset`` points from its point, aligned away from it; its pixel box."""
    from matplotlib.text import Text

    dx, dy = offset
    ann.xyann = offset
    ann.set_horizontalalignment("left" if dx > 0.5 else "right" if dx < -0.5 else "center")
    ann.set_verticalalignment("bottom" if dy > 0.5 else "top" if dy < -0.5 else "center")
    # the text alone: an Annotation's own extent includes its leader line, which always meets its point
    ann.update_positions(renderer)  # Text's extent alone does not follow xyann by itself
    x0, y0, x1, y1 = Text.get_window_extent(ann, renderer).extents
    pad = 4.0 if ann.get_bbox_patch() is not None else 0.0  # the rounded box around the winner's text
    return (x0 - pad, y0 - pad, x1 + pad, y1 + pad)


def _overlap(a: tuple, b: tuple, pad: float = 2.0) -> bool:
    return a[0] - pad < b[2] and b[0] - pad < a[2] and a[1] - pad < b[3] and b[1] - pad < a[3]
