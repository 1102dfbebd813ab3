"""Search spaces sized to the data: menus from the feature spec and a FLOPs range.

NASRec-Full's menus (widths 16..1024 on 7 blocks, 16..64 tokens) were made for Criteo's 45M rows;
on a data set of 10^5 rows the hand-designed baselines cost a hundredth of its candidates. Here a
preset's menus follow the data instead:

* **FLOPs range.** ``auto`` is :func:`auto_flops_range`: from a tenth of the cheapest baseline to
  ten times the median baseline, all six built for this spec and costed analytically
  (:func:`~rankitect.space.flops.cost`, a meta-device build: no training, no memory).
* **Token and field menus** follow the number of fields ``n`` the data gives a model (sparse
  features, plus one dense token): about ``n / 2``, ``n`` and ``2 n``.
* **Width menus** are a geometric ladder of 5 (``engineer``) or 6 (``nasrec``) widths, each twice
  the one before, whose top ``W`` is the largest power of two (16 to 4096) that keeps the
  candidates within the range: the :data:`QUANTILE` quantile of the FLOPs of :data:`PROBES`
  seeded uniform samples must not exceed the range's upper end. Wider menus would hold mostly
  candidates beyond the range; narrower ones would leave its upper part empty.
* ``engineer`` menus then get the values the six baselines use (their widths, fields, rank), so
  the sized space contains every baseline: searches start from them and can return them.

``nasrec_full`` keeps NASRec-Full's menus whatever the data (``search.space=nasrec_full``), as does
``search.flops_range=null`` for any preset.

>>> from rankitect.space.testing import tiny_spec
>>> lo, hi = auto_flops_range(tiny_spec())
>>> 0 < lo < hi
True
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from rankitect.data.spec import FeatureSpec
from rankitect.space.architecture import Architecture
from rankitect.space.baselines import BASELINES, get_baseline
from rankitect.space.flops import cost
from rankitect.space.space import SearchSpace, get_space

PROBES = 16  # uniform samples costed per ladder rung
QUANTILE = 0.9  # of their FLOPs, kept at or below the range's upper end
TOPS = tuple(2 ** k for k in range(4, 13))  # 16 .. 4096: the top widths tried
LOW, HIGH = 0.1, 10.0  # auto range: LOW x the cheapest baseline .. HIGH x the median baseline
# Values the baselines use (rankitect.space.baselines), kept in every sized engineer menu.
BASELINE_MENUS: dict[str, tuple[int, ...]] = {
    "widths": (256, 400, 512), "layer_widths": (512,), "fields": (16,), "wukong_ranks": (24,), "heads": (1, 2),
    "cross_ranks": (0,), "dense_tokens": (1,),
}
SIZED = ("nasrec", "engineer")


def baseline_mflops(spec: FeatureSpec, *, embedding_dim: int = 16) -> dict[str, float]:
    """MFLOPs per example of every baseline built for ``spec`` (analytic, no training)."""
    return {name: cost(get_baseline(name, spec, embedding_dim=embedding_dim), spec).mflops for name in BASELINES}


def auto_flops_range(spec: FeatureSpec, *, embedding_dim: int = 16) -> tuple[float, float]:
    """``(LOW x the cheapest baseline, HIGH x the median baseline)`` in MFLOPs per example."""
    flops = sorted(baseline_mflops(spec, embedding_dim=embedding_dim).values())
    return LOW * flops[0], HIGH * statistics.median(flops)


def check_flops_range(value: Any, key: str = "search.flops_range") -> tuple[float, float]:
    """``[low, high]`` MFLOPs with ``0 < low < high``, as a tuple; anything else is refused naming ``key``."""
    ok = (isinstance(value, (list, tuple)) and len(value) == 2
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
          and 0 < value[0] < value[1] < float("inf"))
    if not ok:
        raise ValueError(f"{key} must be 'auto', null or [low, high] MFLOPs with 0 < low < high, got {value!r}")
    return float(value[0]), float(value[1])


def field_menu(spec: FeatureSpec) -> tuple[int, ...]:
    """About ``n / 2``, ``n`` and ``2 n`` for the ``n`` fields of ``spec`` (sparse plus a dense token)."""
    n = spec.n_sparse + (1 if spec.n_dense else 0)
    return tuple(sorted({max(2, n // 2), max(2, n), 2 * n}))


def ladder(top: int, size: int) -> tuple[int, ...]:
    """``size`` widths halving down from ``top`` (none below 8).

    >>> ladder(256, 5), ladder(32, 5)
    ((16, 32, 64, 128, 256), (8, 16, 32))
    """
    return tuple(sorted({max(8, top >> k) for k in range(size)}))


def _merge(*menus: Sequence[int]) -> tuple[int, ...]:
    return tuple(sorted({v for m in menus for v in m}))


def _menus(name: str, spec: FeatureSpec, top: int, embedding_dim: int, *, baselines: bool) -> dict[str, Any]:
    """The preset options of ``name`` for ``spec`` with the width ladder topped at ``top`` (plus,
    with ``baselines``, the values the baselines use)."""
    fields = field_menu(spec)
    if name == "nasrec":
        return {"widths": ladder(top, 6), "tokens": fields, "merge_tokens": min(8, max(fields))}
    keep = BASELINE_MENUS if baselines else {}
    widths = ladder(top, 5)
    ranks = tuple(r for r in (0, 16, 32, 64) if r < spec.n_sparse * embedding_dim)
    menus = {"widths": widths, "layer_widths": widths, "fields": fields, "cross_ranks": ranks,
             "wukong_ranks": (8, 16, 32), "heads": (1, 2, 4), "dense_tokens": (1, 2, 4)}
    return {k: _merge(v, keep.get(k, ())) for k, v in menus.items()}


def probe_mflops(space: SearchSpace, spec: FeatureSpec, n: int = PROBES, seed: int = 0) -> list[float]:
    """MFLOPs on ``spec`` of ``n`` uniform samples of ``space`` (seeded)."""
    rng = np.random.default_rng(seed)
    return [cost(space.decode(space.sample(rng)), spec).mflops for _ in range(n)]


def sized_space(
    name: str, spec: FeatureSpec, flops_range: tuple[float, float], *, embedding_dim: int = 16,
    rocs: bool = False,
) -> SearchSpace:
    """Preset ``name`` (``nasrec`` or ``engineer``) with menus sized to ``spec`` and ``flops_range``."""
    if name not in SIZED:
        raise ValueError(f"search space {name!r} has no sized menus; sized: {list(SIZED)}")
    _, high = check_flops_range(flops_range)
    base = {"embedding_dim": embedding_dim, "use_dense": spec.n_dense > 0, "rocs": rocs}
    chosen = TOPS[0]
    for top in TOPS[1:]:  # the widest ladder whose candidates stay within the upper end
        space = get_space(name, **base, **_menus(name, spec, top, embedding_dim, baselines=False))
        if float(np.quantile(probe_mflops(space, spec), QUANTILE)) > high:
            break
        chosen = top
    return get_space(name, **base, **_menus(name, spec, chosen, embedding_dim, baselines=True))


def space_for(
    name: str, spec: FeatureSpec, flops_range: str | Sequence[float] | None, *, rocs: bool = False,
) -> SearchSpace:
    """The search space of a run: preset ``name`` sized to ``spec`` (``flops_range`` ``"auto"`` or
    ``[low, high]`` MFLOPs), or with its own menus (``flops_range=None``, or ``nasrec_full``)."""
    use_dense = spec.n_dense > 0
    if flops_range is None or name not in SIZED:
        return get_space(name, use_dense=use_dense, rocs=rocs)
    span = auto_flops_range(spec) if flops_range == "auto" else check_flops_range(flops_range)
    return sized_space(name, spec, span, rocs=rocs)


def contains_baselines(space: SearchSpace, spec: FeatureSpec) -> dict[str, bool]:
    """For every baseline built for ``spec`` at the space's embedding dimension: is it in ``space``?"""
    dim = space.options.get("embedding_dim", 16)
    archs: dict[str, Architecture] = {n: get_baseline(n, spec, embedding_dim=dim) for n in BASELINES}
    return {n: space.contains(a) for n, a in archs.items()}


__all__ = ["auto_flops_range", "baseline_mflops", "check_flops_range", "contains_baselines", "field_menu",
           "ladder", "probe_mflops", "sized_space", "space_for"]
