"""The one registry type behind blocks, search spaces and strategies: lookups, duplicates, bad items."""

from __future__ import annotations

import pytest

from rankitect.registry import Registry, UnknownName


def fruits() -> Registry:
    registry: Registry = Registry("fruit")
    registry.add("apple", "red")
    registry.add("banana", "yellow")
    return registry


def test_an_unknown_name_is_an_error_listing_every_known_one() -> None:
    registry = fruits()
    with pytest.raises(UnknownName) as caught:
        registry["pear"]
    assert str(caught.value) == "unknown fruit 'pear'; known: ['apple', 'banana']"
    assert isinstance(caught.value, KeyError) and isinstance(caught.value, ValueError)


def test_it_reads_like_a_dict() -> None:
    registry = fruits()
    assert dict(registry) == {"apple": "red", "banana": "yellow"}
    assert registry.get("pear") is None and registry.get("apple") == "red"  # Mapping.get catches the KeyError
    assert "apple" in registry and "pear" not in registry and len(registry) == 2


def test_a_taken_name_is_refused_and_keeps_its_item() -> None:
    registry = fruits()
    with pytest.raises(ValueError, match="fruit 'apple' is already registered"):
        registry.add("apple", "green")
    assert registry["apple"] == "red"


def test_the_decorator_adds_its_item_and_returns_it_unchanged() -> None:
    registry: Registry = Registry("shape")

    @registry.register("square")
    def square(side: float) -> float:
        return side * side

    assert registry["square"] is square and square(3.0) == 9.0
    with pytest.raises(ValueError, match=r"shape 'square' is already registered \(.*square\)"):
        registry.register("square")(lambda side: side)


def test_a_base_class_refuses_other_items() -> None:
    class Base:
        pass

    class Kind(Base):
        pass

    registry: Registry = Registry("kind", base=Base)
    assert registry.add("kind", Kind) is Kind
    with pytest.raises(TypeError, match="kind 'other' must subclass Base"):
        registry.add("other", int)
    with pytest.raises(TypeError, match="must subclass Base"):
        registry.add("instance", Kind())
    assert list(registry) == ["kind"]


def test_pop_removes_a_name_and_takes_a_default() -> None:
    registry = fruits()
    assert registry.pop("apple") == "red" and "apple" not in registry
    assert registry.pop("apple", None) is None
    with pytest.raises(UnknownName, match="known: \\['banana'\\]"):
        registry.pop("apple")
    registry.add("apple", "green")  # free again
    assert registry["apple"] == "green"


def test_blocks_spaces_and_strategies_share_it() -> None:
    """Each of the three lookups names the unknown entry and every registered one."""
    from rankitect.blocks.base import BLOCKS, get_block_class
    from rankitect.search.base import STRATEGIES, strategy_options
    from rankitect.space import SPACES, get_space

    for registry, lookup, kind in ((BLOCKS, get_block_class, "block op"), (SPACES, get_space, "search space"),
                                   (STRATEGIES, strategy_options, "strategy")):
        assert isinstance(registry, Registry)
        with pytest.raises(ValueError) as caught:
            lookup("nope")
        assert str(caught.value) == f"unknown {kind} 'nope'; known: {sorted(registry)}"
        assert len(registry) >= 3
