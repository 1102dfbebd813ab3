"""Search spaces: sampling, decode/encode, JSON round trip, builds, mutation, determinism."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rankitect.data.batch import Batch
from rankitect.data.spec import FeatureSpec
from rankitect.space.architecture import Architecture
from rankitect.space.builder import build_model
from rankitect.space.space import SPACES, Choice, get_space

from .conftest import small_space

PRESETS = ["nasrec", "engineer"]


def test_registry_holds_the_presets() -> None:
    assert set(PRESETS) <= set(SPACES)
    with pytest.raises(ValueError, match="unknown search space 'nas'"):
        get_space("nas")
    with pytest.raises(ValueError, match="unknown option 'depth'"):
        get_space("engineer", depth=3)


def test_nasrec_default_is_nasrec_full() -> None:
    space = get_space("nasrec")
    assert space.choices["b0.width"].options == (16, 32, 64, 128, 256, 512, 768, 1024)
    assert space.choices["b6.tokens"].options == (16, 32, 48, 64)
    assert space.choices["b6.flat"].options == ("mlp", "dot", "gating", "sum")
    assert space.choices["b6.field"].options == ("attention", "efc")
    assert [f"b6.in{i}" in space.choices for i in range(5)] == [True] * 4 + [False]
    assert space.choices["b6.in3"].options == ("none", "raw", "0", "1", "2", "3", "4", "5")
    assert not any(label.startswith("b7.") for label in space.choices)


@pytest.mark.parametrize("name", PRESETS)
def test_options_are_json_scalars(name: str) -> None:
    space = get_space(name)
    for c in space.choices.values():
        assert all(o is None or isinstance(o, (bool, int, float, str)) for o in c.options)
    assert json.loads(json.dumps(space.to_dict()))["name"] == name


@pytest.mark.parametrize("name", PRESETS)
def test_1000_default_samples_decode_round_trip_and_encode(name: str) -> None:
    space, rng = get_space(name), np.random.default_rng(0)
    for _ in range(1000):
        arch = space.decode(space.sample(rng))
        back = Architecture.from_json(arch.to_json())
        assert back == arch and back.hash == arch.hash
        sample = space.encode(arch)
        assert sample is not None and set(sample) == set(space.choices)
        assert space.decode(sample) == arch


@pytest.mark.slow
@pytest.mark.parametrize("name", PRESETS)
def test_1000_samples_build_and_train_one_step(name: str, spec: FeatureSpec, batch: Batch) -> None:
    space, rng = small_space(name), np.random.default_rng(1)
    for i in range(1000):
        arch = space.decode(space.sample(rng))
        model = build_model(arch, spec)
        logits = model(batch)
        assert logits.shape == (4,) and bool(torch.isfinite(logits).all())
        torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels).backward()
        missing = [n for n, p in model.named_parameters() if p.grad is None]
        assert not missing, (i, arch.to_json(), missing)


@pytest.mark.parametrize("name", PRESETS)
def test_same_seed_same_samples(name: str) -> None:
    space = get_space(name)
    a = [space.decode(space.sample(np.random.default_rng(5))) for _ in range(2)]
    r1, r2 = np.random.default_rng(9), np.random.default_rng(9)
    assert [space.sample(r1) for _ in range(20)] == [space.sample(r2) for _ in range(20)]
    assert a[0] == a[1]


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("num_mutations", [1, 3])
def test_mutate_gives_a_different_contained_architecture(name: str, num_mutations: int) -> None:
    space, rng = get_space(name), np.random.default_rng(2)
    for _ in range(100):
        arch = space.decode(space.sample(rng))
        child = space.mutate(arch, rng, num_mutations=num_mutations)
        assert child != arch and child.hash != arch.hash
        assert space.contains(child)


@pytest.mark.slow
def test_what_a_mutation_opens_is_drawn_like_a_new_sample() -> None:
    """Labels a mutation wakes are drawn uniformly, not left at the first options encoding gives
    them: from DLRM with its dense features sent to the top only, the children that route them into
    the fields read them as tokens and as buckets about equally often, and children one layer deeper
    than AutoInt's three have every layer op about equally often (binomial bounds at 4.5 sd)."""
    from rankitect.space.baselines import engineer_space_for, get_baseline
    from rankitect.space.testing import tiny_spec

    spec = tiny_spec()
    space, rng = engineer_space_for(spec), np.random.default_rng(0)

    def opened(base: str, woke: str, read: str, n: int = 8000, **change: str) -> list:
        parent = space.decode({**space.encode(get_baseline(base, spec)), **change})
        before = space.encode(parent)
        assert read not in space.active(before)
        seen = []
        for _ in range(n):
            child = space.encode(space.mutate(parent, rng))
            if child[woke] != before[woke] and read in space.active(child):
                seen.append(child[read])
        return seen

    fields = opened("dlrm", "dense.path", "dense.fields", **{"dense.path": "top"})
    ops = opened("autoint", "depth", "L3.op")
    for seen, options in ((fields, ("tokens", "buckets")), (ops, ("attention", "wukong", "dhen"))):
        n, p = len(seen), 1 / len(options)
        assert n >= 60
        for option in options:
            assert abs(seen.count(option) - n * p) <= 4.5 * (n * p * (1 - p)) ** 0.5, (option, n, seen.count(option))


@pytest.mark.parametrize("name", PRESETS)
def test_inactive_labels_are_ignored(name: str) -> None:
    space, rng = get_space(name), np.random.default_rng(4)
    for _ in range(50):
        sample = space.sample(rng)
        active = set(space.active(sample))
        assert space.decode({k: v for k, v in sample.items() if k in active}) == space.decode(sample)
        for label in set(sample) - active:  # re-drawing an inactive label changes nothing
            other = dict(sample, **{label: space.choices[label].options[0]})
            assert space.decode(other) == space.decode(sample)


def test_engineer_inactive_examples() -> None:
    space = get_space("engineer")
    sample = space.sample(np.random.default_rng(0))
    sample.update({"depth": 1, "L0.op": "attention", "cross.layers": 0, "bottom.layers": 0})
    active = set(space.active(sample))
    assert {"L0.attention.heads", "L0.attention.ffn"} <= active
    assert not {"L1.op", "L0.wukong.fmb", "cross.rank", "bottom.width"} & active


def test_decode_rejects_bad_samples() -> None:
    space = get_space("nasrec", num_blocks=2)
    sample = space.sample(np.random.default_rng(0))
    with pytest.raises(ValueError, match="b1.width"):
        space.decode({k: v for k, v in sample.items() if k != "b1.width"})
    with pytest.raises(ValueError, match="b0.width"):
        space.decode(dict(sample, **{"b0.width": 17}))


def test_encode_rejects_architectures_outside_the_space() -> None:
    space = get_space("nasrec", num_blocks=2)
    arch = space.decode(space.sample(np.random.default_rng(0)))
    assert space.encode(arch) is not None
    assert get_space("nasrec", num_blocks=3).encode(arch) is None
    assert get_space("nasrec", num_blocks=2, widths=(7,)).encode(arch) is None
    assert get_space("engineer").encode(arch) is None
    with pytest.raises(ValueError, match="not in space"):
        get_space("engineer").mutate(arch, np.random.default_rng(0))


def test_nasrec_sources_are_canonical() -> None:
    space = get_space("nasrec", num_blocks=3)
    sample = space.sample(np.random.default_rng(0))
    a = dict(sample, **{"b2.in0": "1", "b2.in1": "raw", "b2.in2": "1"})
    b = dict(sample, **{"b2.in0": "raw", "b2.in1": "1", "b2.in2": "none"})
    assert space.decode(a) == space.decode(b)


def test_choice_validation() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        Choice("x", (1, 1))
    with pytest.raises(ValueError, match="JSON scalar"):
        Choice("x", ((1, 2),))
    with pytest.raises(ValueError, match="at least one"):
        Choice("x", ())
    assert Choice("x", (1, True)).index(True) == 1


@pytest.mark.parametrize("name", ["nasrec", "engineer"])
def test_rocs_spaces_search_the_request_share(name: str) -> None:
    """With ``rocs=True`` the request share is one more choice: sampled, encoded and mutated."""
    shares = (None, 0.5, 0.75)
    space = get_space(name, rocs=True, rocs_shares=shares)
    assert "rocs_share" not in get_space(name).choices  # unmasked spaces have no share to choose
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(60):
        arch = space.decode(space.sample(rng))
        assert arch.rocs and arch.rocs_share in shares
        seen.add(arch.rocs_share)
        sample = space.encode(arch)
        assert sample is not None and sample["rocs_share"] == arch.rocs_share
        assert Architecture.from_json(arch.to_json()) == arch
    assert seen == set(shares)
    # Mutating only the share: every other choice fixed, the child differs in its share alone.
    arch = space.decode(space.sample(rng))
    sample = space.encode(arch)
    other = next(s for s in shares if s != arch.rocs_share)
    child = space.decode({**sample, "rocs_share": other})
    assert child.rocs_share == other and child.blocks == arch.blocks and child.head == arch.head
    # An architecture with a share outside the menu is not in the space.
    import dataclasses

    assert not space.contains(dataclasses.replace(arch, rocs_share=0.9))


@pytest.mark.parametrize("bad", [(1.0,), (0.0,), ("half",), (True,), ()])
def test_rocs_share_menu_is_checked(bad: tuple) -> None:
    with pytest.raises(ValueError, match="rocs_shares"):
        get_space("nasrec", rocs=True, rocs_shares=bad)
