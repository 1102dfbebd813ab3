"""Spaces sized to the data: the menus reach the FLOPs range on several specs, the default space
holds the six baselines, and no supernet site outgrows the range."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import torch

from rankitect.config import load_config
from rankitect.data import open_data
from rankitect.space import cost, get_space
from rankitect.space.baselines import BASELINES, get_baseline
from rankitect.space.nasrec import NASREC_TOKENS, NASREC_WIDTHS
from rankitect.search.proposing.sizing import (
    BASELINE_MENUS, SITE_CAP, auto_flops_range, cap_sites, check_flops_range, contains_baselines, space_for,
)
from rankitect.space.testing import tiny_spec
from rankitect.supernet.model import Supernet

# (dense, sparse) features: no dense, few fields, the synthetic default's 13 + 26, a wide table.
SPECS = {"10 sparse": (0, 10), "2 + 3": (2, 3), "13 + 26": (13, 26), "4 + 60": (4, 60)}


def flops_of_samples(space, spec, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.array([cost(space.decode(space.sample(rng)), spec).mflops for _ in range(n)])


def test_auto_range_is_a_tenth_of_the_cheapest_to_ten_times_the_median_baseline():
    spec = tiny_spec(13, 26)
    flops = [cost(get_baseline(n, spec), spec).mflops for n in BASELINES]
    assert auto_flops_range(spec) == pytest.approx((0.1 * min(flops), 10 * statistics.median(flops)))


@pytest.mark.slow
@pytest.mark.parametrize("shape", list(SPECS.values()), ids=list(SPECS))
def test_sized_engineer_menus_reach_the_flops_range(shape):
    spec = tiny_spec(*shape)
    low, high = auto_flops_range(spec)
    space = space_for("engineer", spec, "auto")
    flops = flops_of_samples(space, spec, 60, seed=123)  # other draws than the sizing's own
    inside = np.mean((flops >= low) & (flops <= high))
    assert inside >= 0.8, (inside, low, high, np.percentile(flops, [0, 50, 100]))
    assert flops.max() >= high / 8  # the menus reach into the range's upper part


@pytest.mark.slow
@pytest.mark.parametrize("shape", [SPECS["10 sparse"], SPECS["13 + 26"]], ids=["10 sparse", "13 + 26"])
def test_sized_nasrec_menus_reach_the_flops_range(shape):
    spec = tiny_spec(*shape)
    low, high = auto_flops_range(spec)
    space = space_for("nasrec", spec, "auto")
    flops = flops_of_samples(space, spec, 40, seed=123)
    assert np.mean((flops >= low) & (flops <= high)) >= 0.75
    full = flops_of_samples(get_space("nasrec_full", use_dense=spec.n_dense > 0), spec, 40, seed=123)
    assert np.median(flops) < np.median(full)  # NASRec-Full's menus were made for Criteo's scale


@pytest.mark.slow
def test_an_explicit_range_moves_the_menus():
    spec = tiny_spec(13, 26)
    small = space_for("nasrec", spec, [0.01, 1.0])
    large = space_for("nasrec", spec, [0.1, 100.0])
    assert max(small.options["widths"]) < max(large.options["widths"])
    assert np.median(flops_of_samples(small, spec, 20, 5)) < np.median(flops_of_samples(large, spec, 20, 5))


@pytest.mark.parametrize("shape", list(SPECS.values()), ids=list(SPECS))
def test_the_default_space_holds_all_six_baselines(shape):
    spec = tiny_spec(*shape)
    cfg = load_config()
    space = space_for(cfg.search.space, spec, cfg.search.flops_range)
    for name in BASELINES:
        arch = get_baseline(name, spec)
        sample = space.encode(arch)
        assert sample is not None, name
        assert space.decode(sample) == arch and space.contains(arch)


def test_nasrec_full_keeps_nasrec_full_menus_whatever_the_data():
    space = space_for("nasrec_full", tiny_spec(0, 3), "auto")
    assert space.options["widths"] == NASREC_WIDTHS and space.options["tokens"] == NASREC_TOKENS
    assert space_for("nasrec", tiny_spec(0, 3), None).options["widths"] == NASREC_WIDTHS


@pytest.mark.parametrize("bad", [[1.0], [2.0, 1.0], [0.0, 1.0], ["a", 2.0], "big", [True, 2.0]])
def test_bad_ranges_are_refused_naming_the_key(bad):
    with pytest.raises(ValueError, match="search.flops_range"):
        check_flops_range(bad)


def largest_site(space, spec) -> int:
    """Weights of the largest op (or the head) of the space's supernet, built on the meta device."""
    with torch.device("meta"):
        supernet = Supernet(space, spec)
    modules = [*supernet.ops.values(), supernet.head]
    return max(sum(p.numel() for p in m.parameters()) for m in modules)


def default_spec():
    cfg = load_config(overrides=[])
    return open_data(cfg.data.source, cfg.data, progress=False).spec


# tiny_spec, the synthetic default data's spec, 10 categorical fields, the adult schema's shape (6 + 8).
CAP_SPECS = {"tiny": tiny_spec, "synthetic default": default_spec, "10 sparse": lambda: tiny_spec(0, 10),
             "adult 6 + 8": lambda: tiny_spec(6, 8)}


@pytest.mark.parametrize("make_spec", list(CAP_SPECS.values()), ids=list(CAP_SPECS))
def test_sized_engineer_supernet_sites_stay_within_the_cap(make_spec):
    spec = make_spec()
    high = 10 * statistics.median(cost(get_baseline(n, spec), spec).mflops for n in BASELINES)
    cap = SITE_CAP * high * 1e6 / 2  # SITE_CAP models at the range's upper end, 2 FLOPs a weight
    space = space_for("engineer", spec, "auto")
    assert largest_site(space, spec) <= cap
    assert all(contains_baselines(space, spec).values())
    flops = flops_of_samples(space, spec, 40, seed=7)
    assert flops.max() >= high / 8  # the capped menus still reach into the range's upper part


def test_the_cap_shrinks_the_synthetic_default_supernet_and_keeps_nasrec_within_it():
    spec = default_spec()
    high = auto_flops_range(spec)[1]
    fields = space_for("engineer", spec, "auto").options["fields"]
    assert max(fields) < 2 * spec.n_sparse  # 2 n fields per Wukong output made a 238M-weight DCN
    nasrec = space_for("nasrec", spec, "auto")
    assert largest_site(nasrec, spec) <= SITE_CAP * high * 1e6 / 2
    flops = flops_of_samples(nasrec, spec, 40, seed=7)
    assert np.mean(flops <= high) >= 0.75 and flops.max() >= high / 8


def test_cap_sites_drops_tops_down_to_what_it_must_keep():
    spec = tiny_spec(13, 26)
    base = {"embedding_dim": 16, "use_dense": True, "rocs": False}
    menus = {"widths": (64, 256, 512, 1024), "layer_widths": (128, 512, 1024), "fields": (13, 16, 27, 54),
             "cross_ranks": (0, 16, 32, 64), "wukong_ranks": (8, 16, 24, 32), "heads": (1, 2, 4),
             "dense_tokens": (1, 2, 4)}
    space = get_space("engineer", **base, **menus)
    assert cap_sites("engineer", spec, base, menus, cap=largest_site(space, spec)) == menus  # within: kept
    low = cap_sites("engineer", spec, base, menus, cap=0, keep=BASELINE_MENUS)
    reached = largest_site(get_space("engineer", **base, **low), spec)
    assert reached < largest_site(space, spec)
    for key, menu in low.items():  # a prefix of the menu, and no top left whose drop would shrink the site
        assert menu and menu == menus[key][:len(menu)]
        if len(menu) > 1 and menu[-1] not in BASELINE_MENUS[key]:
            assert largest_site(get_space("engineer", **base, **{**low, key: menu[:-1]}), spec) >= reached, key
