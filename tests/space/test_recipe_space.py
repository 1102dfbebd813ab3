"""Recipe choices in every preset: decoded into the genes, encoded back, mutated; baselines stay in."""

from __future__ import annotations

import numpy as np
import pytest

from rankitect.search.proposing.sizing import recipe_menus_for
from rankitect.space.architecture import Architecture, BlockGene, HeadGene
from rankitect.space.baselines import BASELINES, engineer_space_for, get_baseline
from rankitect.space.recipe import Recipe
from rankitect.space.recipe_space import PREFIX
from rankitect.space.space import SPACES, Choice, SearchSpace, get_space, register_space
from rankitect.space.testing import tiny_spec
from tests.space.conftest import SMALL_ENGINEER, SMALL_NASREC
from tests.space.test_recipe import mixed_spec


def spaces():
    return [get_space("nasrec", **SMALL_NASREC, head_widths=(8,)), get_space("engineer", **SMALL_ENGINEER)]


def genes_of(arch: Architecture) -> dict:
    """The recipe genes as the architecture holds them, read independently of the space's reader."""
    dropouts = {g.params["dropout"] for g in arch.blocks if g.op in ("mlp", "attention")}
    norms = {g.params["norm"] for g in arch.blocks if g.op == "mlp"}
    return {"dropouts": dropouts, "norms": norms, "head": (arch.head.dropout, arch.head.norm), "recipe": arch.recipe}


@pytest.mark.parametrize("space", spaces(), ids=lambda s: s.name)
def test_recipe_labels_set_the_genes_and_round_trip(space) -> None:
    rng = np.random.default_rng(0)
    for _ in range(30):
        sample = space.sample(rng)
        arch = space.decode(sample)
        v = {gene: sample[PREFIX + gene] for gene in space.recipe_genes}
        got = genes_of(arch)
        assert got["dropouts"] <= {v["dropout"]}
        assert got["norms"] <= {v["norm"]}
        if arch.head.widths:
            assert got["head"] == (v["dropout"], v["head_norm"])
        dims = {g: v[g] if v[g] != space.options["embedding_dim"] else None for g in ("dim_small", "dim_medium",
                                                                                        "dim_large")}
        assert got["recipe"] == Recipe(**dims, embedding_l2=v["embedding_l2"], lr_dense=v["lr_dense"],
                                       lr_sparse=v["lr_sparse"])
        encoded = space.encode(arch)
        assert encoded is not None and space.decode(encoded) == arch
        assert Architecture.from_json(arch.to_json()) == arch


@pytest.mark.parametrize("space", spaces(), ids=lambda s: s.name)
def test_mutation_reaches_the_recipe(space) -> None:
    rng = np.random.default_rng(1)
    arch = space.decode(space.sample(rng))
    changed = set()
    for _ in range(150):
        child = space.mutate(arch, rng)
        if child.recipe != arch.recipe:
            changed.add("recipe")
        if (child.head.norm, child.head.dropout) != (arch.head.norm, arch.head.dropout):
            changed.add("head")
    assert changed == {"recipe", "head"}


def test_baselines_are_points_of_the_space_with_todays_recipe() -> None:
    spec = tiny_spec()
    space = engineer_space_for(spec)
    assert any(label.startswith(PREFIX) for label in space.choices)
    for name in BASELINES:
        arch = get_baseline(name, spec)
        sample = space.encode(arch)
        assert sample is not None, name
        assert sample[PREFIX + "dropout"] == 0.0 and sample[PREFIX + "lr_dense"] == 1.0
        assert sample[PREFIX + "dim_small"] is None and sample[PREFIX + "embedding_l2"] == 0.0


def test_a_layer_dropout_that_differs_from_the_others_is_not_in_the_space() -> None:
    from dataclasses import replace

    space = get_space("engineer", **SMALL_ENGINEER)
    rng = np.random.default_rng(3)
    arch = space.decode(space.sample(rng))
    while not (arch.head.widths and any(g.op == "mlp" for g in arch.blocks)):
        arch = space.decode(space.sample(rng))
    same = space.decode({**space.encode(arch), PREFIX + "dropout": 0.1})
    assert space.contains(same)
    assert not space.contains(replace(same, head=replace(same.head, dropout=0.2)))


def test_without_recipe_menus_a_space_has_no_recipe_choice() -> None:
    space = get_space("nasrec", **SMALL_NASREC, recipe={})
    assert not any(label.startswith(PREFIX) for label in space.choices)


def test_bad_recipe_menus_are_refused() -> None:
    with pytest.raises(ValueError, match="warmup"):
        get_space("nasrec", **SMALL_NASREC, recipe={"warmup": (1,)})
    with pytest.raises(ValueError, match="dropout"):
        get_space("nasrec", **SMALL_NASREC, recipe={"dropout": (0.0, 1.5)})


def test_sized_recipe_menus_follow_the_vocabularies() -> None:
    menus = recipe_menus_for(mixed_spec())
    assert menus["dim_small"] == (None, 4, 8)  # vocabularies 5 and 8: no table wider than 8 rows
    assert menus["dim_medium"] == menus["dim_large"] == (None, 4, 8, 32)
    menus = recipe_menus_for(tiny_spec())
    assert "dim_medium" not in menus and "dim_large" not in menus


class PlainSpace(SearchSpace):
    """A user's space whose factory has no ``recipe`` option: one MLP width, D = 4."""

    def __init__(self, *, use_dense: bool = True) -> None:
        super().__init__("plain", [Choice("width", (8, 16))], {"use_dense": use_dense, "embedding_dim": 4})

    def _decode(self, sample) -> Architecture:
        return Architecture((BlockGene("mlp", ("dense", "sparse"), {"width": sample["width"]}),), HeadGene((0,), (4,)),
                            embedding_dim=4)

    def _encode(self, arch: Architecture) -> dict:
        return {"width": arch.blocks[0].params["width"]}


@pytest.fixture()
def plain_space():
    register_space("plain")(PlainSpace)
    try:
        yield
    finally:
        SPACES.pop("plain", None)


def test_a_space_whose_factory_takes_no_recipe_gets_its_choices(plain_space) -> None:
    menus = recipe_menus_for(mixed_spec(), 4)
    space = get_space("plain", recipe=menus)
    assert space.recipe_genes == tuple(menus)
    assert space.to_dict()["options"]["recipe"]["dropout"] == [0.0, 0.1, 0.2, 0.3]
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(20):
        sample = space.sample(rng)
        arch = space.decode(sample)
        mlp = arch.blocks[0].params
        assert (mlp["dropout"], mlp["norm"], arch.head.norm) == tuple(sample[PREFIX + g] for g in ("dropout", "norm",
                                                                                                    "head_norm"))
        assert arch.recipe.lr_sparse == sample[PREFIX + "lr_sparse"]
        assert space.decode(space.encode(arch)) == arch
        seen.add(arch.recipe)
    assert len(seen) > 1
    assert get_space("plain").recipe_genes == ()  # none asked for, none added
    with pytest.raises(ValueError, match="already has recipe choices"):
        space.add_recipe(menus)
