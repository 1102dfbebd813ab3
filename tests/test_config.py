from pathlib import Path

import pytest

from rankitect.config import Config, flatten, load_config, to_dict
from rankitect.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_default_yaml_spells_out_the_dataclass_defaults() -> None:
    assert load_config(ROOT / "configs" / "default.yaml") == Config()


def test_every_shipped_config_loads() -> None:
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        load_config(path)


def test_overrides_win_over_file_and_are_typed(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("search:\n  trials: 3\n  target_mflops: 2\ntrain:\n  lr_dense: 0.5\n")
    cfg = load_config(f, ["search.trials=5", "search.evolution.population=7", "search.storage=null"])
    assert cfg.search.trials == 5
    assert cfg.search.target_mflops == 2.0 and isinstance(cfg.search.target_mflops, float)
    assert cfg.train.lr_dense == 0.5
    assert cfg.search.evolution.population == 7
    assert cfg.search.storage is None
    assert load_config(overrides=["train.lr_dense=1e-3"]).train.lr_dense == 1e-3


@pytest.mark.parametrize(
    "override, key",
    [
        ("search.trails=3", "search.trails"),
        ("nope=1", "nope"),
        ("search.evolution.popsize=3", "search.evolution.popsize"),
        ("search.trials=three", "search.trials"),
        ("train.steps=1.5", "train.steps"),
        ("search.penalty=square", "search.penalty"),
        ("search.baselines=dlrm", "search.baselines"),
        ("search.evolution=3", "search.evolution"),
    ],
)
def test_bad_key_or_type_names_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(overrides=[override])


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)
    with pytest.raises(ConfigError, match="key=value"):
        load_config(overrides=["train.steps"])


def test_flatten_round_trips_every_leaf() -> None:
    flat = flatten(to_dict(Config()))
    assert flat["search.evolution.population"] == Config().search.evolution.population
    assert all("." in k for k in flat)


def _numeric_keys(cls: type, prefix: str = "") -> dict[str, type]:
    """Every key whose type admits an int or a float, with that type (int first)."""
    import dataclasses
    import typing

    keys = {}
    for name, tp in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(tp):
            keys.update(_numeric_keys(tp, f"{prefix}{name}."))
        elif {int, float} & ({tp} | set(typing.get_args(tp))):
            keys[prefix + name] = int if int in ({tp} | set(typing.get_args(tp))) else float
    return keys


def test_every_numeric_key_has_a_range_and_nothing_else_does() -> None:
    from rankitect.config import RANGES

    assert sorted(RANGES) == sorted(_numeric_keys(Config))


def test_each_range_is_checked_at_its_bound() -> None:
    """Walk every range: its closed bound loads, the nearest value outside it is refused naming the key."""
    from rankitect.config import RANGES

    base = ["search.evolution.sample_size=1", "search.oneshot.sample_size=1"]  # bounded by the populations
    for key, allowed in RANGES.items():
        is_int = _numeric_keys(Config)[key] is int
        if allowed.low is None:
            continue
        if not allowed.open_low:
            assert flatten(to_dict(load_config(overrides=[*base, f"{key}={allowed.low}"])))[key] == allowed.low
        outside = allowed.low - (0 if allowed.open_low else (1 if is_int else 1e-9))
        with pytest.raises(ConfigError, match=f"'{key}' must be {'>' if allowed.open_low else '>='}"):
            load_config(overrides=[*base, f"{key}={outside}"])


@pytest.mark.parametrize("value", ["nan", ".nan", ".inf"])
def test_non_finite_numbers_are_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="train.lr_dense"):
        load_config(overrides=[f"train.lr_dense={value}"])


def test_a_tournament_larger_than_its_population_is_refused() -> None:
    with pytest.raises(ConfigError, match="search.evolution.sample_size' must be <= search.evolution.population"):
        load_config(overrides=["search.evolution.population=2", "search.evolution.sample_size=3"])
