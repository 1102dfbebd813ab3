"""Search spaces sized to the data: menus from the feature spec and a FLOPs range.

It lives in ``search/``, above ``supernet/``, because the menus are capped by the supernet's
memory estimate (the widest corner, below).

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
* **Recipe menus** (:mod:`rankitect.space.recipe_space`): a table-width menu only for the
  vocabulary groups the data has features in, without widths above the group's largest
  vocabulary (a table wider than its row count learns nothing a narrower one cannot).
* ``engineer`` menus then get the values the six baselines use (their widths, fields, rank), so
  the sized space contains every baseline: searches start from them and can return them.
* **Widest corner.** The supernet of the space (:mod:`rankitect.supernet`) allocates every site at
  the largest value of every menu at once, a corner no probe draws: on the synthetic default spec a
  full-rank DCN over the dot readout of two 54-field Wukong outputs held 238M weights for a range
  ending at 12 MFLOPs. While the largest site holds more than :func:`site_cap` weights
  (:data:`SITE_CAP` models at the range's upper end), the menu top whose removal shrinks it the
  most is dropped (ties: the fewest dense weights), re-estimated each time
  (:func:`~rankitect.supernet.memory.estimate_supernet_memory`, a meta-device build). Baseline
  values are never dropped, so a space stays over the cap only where the baselines' own values
  make such a site.

``nasrec_full`` keeps NASRec-Full's menus whatever the data (``search.space=nasrec_full``), as does
``search.flops_range=null`` for any preset.

>>> from rankitect.space.testing import tiny_spec
>>> lo, hi = auto_flops_range(tiny_spec())
>>> 0 < lo < hi
True
"""

from __future__ import annotations

import copy
import functools
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from rankitect.data.spec import FeatureSpec
from rankitect.space.architecture import Architecture
from rankitect.space.baselines import BASELINES, baselines_for, get_baseline, history_options
from rankitect.space.flops import cost
from rankitect.space.recipe import DIM_GENES, GROUP_NAMES, vocab_group
from rankitect.space.recipe_space import default_recipe_menus
from rankitect.space.space import SearchSpace, get_space
from rankitect.supernet.memory import estimate_supernet_memory

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
# A supernet site may hold this many times the weights of a model at the range's upper end (a
# weight costs 2 FLOPs an example): a path through a site's widest corner then costs a few times
# the upper end, about the costliest of the probes, and no site dwarfs every candidate that can
# use it. 1 would cut menus below what the probes already keep in range (a path's FLOPs spread over
# several sites); 4 still leaves the widest supernet near 10^8 weights, not 10^9.
SITE_CAP = 4.0
# Menus whose top value may be dropped to keep the widest corner within the cap.
CAPPED = ("widths", "layer_widths", "tokens", "fields", "dense_tokens", "wukong_ranks", "heads", "cross_ranks")


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


def site_cap(high: float) -> int:
    """Weights the largest supernet site of a space sized to a range ending at ``high`` MFLOPs may
    hold: :data:`SITE_CAP` times the weights of a model at ``high`` (2 FLOPs a weight).

    >>> site_cap(12.0)
    24000000
    """
    return int(SITE_CAP * high * 1e6 / 2)


def _widest(name: str, spec: FeatureSpec, base: dict[str, Any], menus: dict[str, Any]) -> tuple[int, int]:
    """Weights of the largest site and dense weights of the supernet of ``name`` with ``menus``."""
    memory = estimate_supernet_memory(get_space(name, **base, **menus), spec)
    return memory.sites[0][1], memory.dense_params


def cap_sites(
    name: str, spec: FeatureSpec, base: dict[str, Any], menus: dict[str, Any], cap: int,
    keep: dict[str, tuple[int, ...]] | None = None,
) -> dict[str, Any]:
    """``menus`` with top values dropped, greedily, until the largest supernet site holds at most
    ``cap`` weights: each round drops the top of the :data:`CAPPED` menu whose removal shrinks the
    largest site the most (ties: the fewest dense weights). A menu is never emptied and a top value
    in ``keep`` is never dropped; the result stays over ``cap`` when no drop left shrinks the largest
    site (on wide data, a full-rank DCN, the DCNv2 baseline's, over the dot readout of every field
    pair: no menu sizes that)."""
    keep = keep or {}
    size = _widest(name, spec, base, menus)
    while size[0] > cap:
        trials = []
        for key in CAPPED:
            menu = menus.get(key)
            if menu is None or len(menu) < 2 or menu[-1] in keep.get(key, ()):
                continue
            trial = {**menus, key: menu[:-1]}
            if name == "nasrec":
                trial["merge_tokens"] = min(trial["merge_tokens"], max(trial["tokens"]))
            trials.append((_widest(name, spec, base, trial), trial))
        if not trials:
            break
        best_size, best = min(trials, key=lambda t: t[0])
        if best_size[0] >= size[0]:  # no drop shrinks the largest site: dropping more only narrows
            break
        size, menus = best_size, best
    return menus


def recipe_menus_for(spec: FeatureSpec, embedding_dim: int = 16) -> dict[str, tuple[Any, ...]]:
    """The default recipe menus, the table widths of each vocabulary group sized to ``spec``.

    >>> from rankitect.space.testing import tiny_spec  # vocabularies 5 to 20: all small
    >>> menus = recipe_menus_for(tiny_spec())
    >>> menus["dim_small"], "dim_large" in menus
    ((None, 4, 8), False)
    """
    menus = default_recipe_menus(embedding_dim)
    largest: dict[str, int] = {}
    for f in spec.sparse:
        group = vocab_group(f.vocab_size)
        largest[group] = max(largest.get(group, 0), f.vocab_size)
    for group, gene in zip(GROUP_NAMES, DIM_GENES):
        if group not in largest:
            del menus[gene]
        else:
            menus[gene] = tuple(d for d in menus[gene] if d is None or d <= largest[group])
    return menus


def probe_mflops(space: SearchSpace, spec: FeatureSpec, n: int = PROBES, seed: int = 0) -> list[float]:
    """MFLOPs on ``spec`` of ``n`` uniform samples of ``space`` (seeded)."""
    rng = np.random.default_rng(seed)
    return [cost(space.decode(space.sample(rng)), spec).mflops for _ in range(n)]


def sized_space(
    name: str, spec: FeatureSpec, flops_range: tuple[float, float], *, embedding_dim: int = 16,
    rocs: bool = False,
) -> SearchSpace:
    """Preset ``name`` (``nasrec`` or ``engineer``) with menus sized to ``spec`` and ``flops_range``,
    its supernet's largest site capped at :func:`site_cap` of the range's upper end."""
    if name not in SIZED:
        raise ValueError(f"search space {name!r} has no sized menus; sized: {list(SIZED)}")
    low, high = check_flops_range(flops_range)
    # a copy: a space may keep (and a caller change) the dicts it was built from
    return get_space(name, **copy.deepcopy(_sized_options(name, spec, (low, high), embedding_dim, rocs)))


@functools.lru_cache(maxsize=16)
def _sized_options(
    name: str, spec: FeatureSpec, flops_range: tuple[float, float], embedding_dim: int, rocs: bool,
) -> dict[str, Any]:
    """The options of :func:`sized_space`: a pure function of its arguments, computed once per
    process (it prices a few hundred samples and supernets: a CPU-second or two)."""
    high = flops_range[1]
    base = {"embedding_dim": embedding_dim, "use_dense": spec.n_dense > 0, "rocs": rocs,
            "recipe": recipe_menus_for(spec, embedding_dim), **_history(name, spec)}
    chosen = TOPS[0]
    for top in TOPS[1:]:  # the widest ladder whose candidates stay within the upper end
        space = get_space(name, **base, **_menus(name, spec, top, embedding_dim, baselines=False))
        if float(np.quantile(probe_mflops(space, spec), QUANTILE)) > high:
            break
        chosen = top
    menus = _menus(name, spec, chosen, embedding_dim, baselines=True)
    keep = BASELINE_MENUS if name == "engineer" else {}
    return {**base, **cap_sites(name, spec, base, menus, site_cap(high), keep)}


def space_for(
    name: str, spec: FeatureSpec, flops_range: str | Sequence[float] | None, *, rocs: bool = False,
) -> SearchSpace:
    """The search space of a run: preset ``name`` sized to ``spec`` (``flops_range`` ``"auto"`` or
    ``[low, high]`` MFLOPs), or with its own menus (``flops_range=None``, or ``nasrec_full``)."""
    use_dense = spec.n_dense > 0
    if flops_range is None or name not in SIZED:
        return get_space(name, use_dense=use_dense, rocs=rocs, recipe=recipe_menus_for(spec), **_history(name, spec))
    span = auto_flops_range(spec) if flops_range == "auto" else check_flops_range(flops_range)
    return sized_space(name, spec, span, rocs=rocs)


def _history(name: str, spec: FeatureSpec) -> dict[str, Any]:
    """The history options of preset ``name`` for ``spec``: the ``engineer`` space routes the data's
    history (:func:`~rankitect.space.baselines.history_options`); the others have no history choice."""
    return history_options(spec) if name == "engineer" else {}


def contains_baselines(space: SearchSpace, spec: FeatureSpec) -> dict[str, bool]:
    """For every baseline built for ``spec`` (DIN and BST too, on data with a history) at the space's
    embedding dimension: is it in ``space``?"""
    dim = space.options.get("embedding_dim", 16)
    archs: dict[str, Architecture] = {n: get_baseline(n, spec, embedding_dim=dim) for n in baselines_for(spec)}
    return {n: space.contains(a) for n, a in archs.items()}


__all__ = ["auto_flops_range", "baseline_mflops", "cap_sites", "check_flops_range", "contains_baselines",
           "field_menu", "ladder", "probe_mflops", "recipe_menus_for", "site_cap", "sized_space", "space_for"]
