import re
from pathlib import Path

import pytest
import yaml

from rankitect.config import Config, config_from_dict, load_config

from rankitect.config_rules import RENAMED, flatten, rename_old_keys, to_dict
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
    from rankitect.config_rules import RANGES

    assert sorted(RANGES) == sorted(_numeric_keys(Config))


def _refused(key: str, value: float, allowed) -> None:
    """``key=value`` is refused in the one message form: the key, its range, the value."""
    with pytest.raises(ConfigError) as e:
        load_config(overrides=[*BOUNDED_BASE, f"{key}={value}"])
    assert str(e.value) == f"config key {key!r} must be {allowed}, got {value!r}"


BOUNDED_BASE = ["search.evolution.sample_size=1", "search.oneshot.sample_size=1"]  # bounded by the populations


def test_each_range_is_checked_at_its_bounds() -> None:
    """Walk every range: its closed bounds load, the nearest values outside are refused naming the
    key, its range and the value, in one form whatever the section."""
    from rankitect.config_rules import RANGES

    for key, allowed in RANGES.items():
        step = 1 if _numeric_keys(Config)[key] is int else 1e-9
        for bound, outside in ((allowed.low, -step), (allowed.high, step)):
            if bound is None:
                continue
            if not (bound == allowed.low and allowed.open_low):
                assert flatten(to_dict(load_config(overrides=[*BOUNDED_BASE, f"{key}={bound}"])))[key] == bound
            value = bound if bound == allowed.low and allowed.open_low else bound + outside
            _refused(key, int(value) if step == 1 else float(value), allowed)


@pytest.mark.parametrize("value", ["nan", ".nan", ".inf"])
def test_non_finite_numbers_are_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="train.lr_dense"):
        load_config(overrides=[f"train.lr_dense={value}"])


def test_a_tournament_larger_than_its_population_is_refused() -> None:
    with pytest.raises(ConfigError, match="search.evolution.sample_size' must be <= search.evolution.population"):
        load_config(overrides=["search.evolution.population=2", "search.evolution.sample_size=3"])


def test_each_section_checks_its_numbers_in_the_one_form() -> None:
    """A number out of range in every section that has numbers: the same message form, naming the key."""
    from rankitect.config_rules import RANGES

    sections = {key.rsplit(".", 1)[0] for key in RANGES}
    assert {"data", "train", "search", "search.evolution", "search.oneshot", "search.oneshot.supernet", "search.dnas",
            "search.dnas.supernet", "search.dnas.gumbel", "search.dnas.reinforce", "search.dnas.ranking",
            "search.surrogate", "search.verdict", "runtime"} == sections
    for section in sorted(sections):
        key = next(k for k in RANGES if k.rsplit(".", 1)[0] == section)
        allowed = RANGES[key]
        value = allowed.low if allowed.open_low else allowed.low - 1
        _refused(key, int(value) if _numeric_keys(Config)[key] is int else float(value), allowed)


def test_a_section_given_to_a_strategy_is_checked_by_the_same_table() -> None:
    from rankitect.config import DnasConfig, GumbelConfig, SurrogateConfig
    from rankitect.config_rules import check_section
    from rankitect.search import build_strategy
    from rankitect.space import get_space

    with pytest.raises(ConfigError) as loaded:
        load_config(overrides=["search.dnas.gumbel.tau_end=0"])
    with pytest.raises(ConfigError) as given:
        build_strategy("dnas", get_space("nasrec"), seed=0, config=DnasConfig(gumbel=GumbelConfig(tau_end=0.0)))
    assert str(given.value) == str(loaded.value) == "config key 'search.dnas.gumbel.tau_end' must be > 0, got 0.0"
    check_section(DnasConfig(), "search.dnas")  # the defaults pass
    with pytest.raises(ConfigError, match=re.escape("config key 'search.surrogate.kappa' must be >= 0, got -1.0")):
        build_strategy("random", get_space("nasrec"), seed=0, surrogate=SurrogateConfig(kappa=-1.0))


def test_a_nested_section_keeps_the_defaults_of_where_it_sits() -> None:
    """One SupernetConfig type, two places with their own defaults: setting one key keeps the rest."""
    cfg = load_config(overrides=["search.oneshot.supernet.steps=5", "search.dnas.supernet.top_k=2"])
    assert (cfg.search.oneshot.supernet.steps, cfg.search.oneshot.supernet.epochs) == (5, 1.0)
    assert (cfg.search.dnas.supernet.steps, cfg.search.dnas.supernet.epochs, cfg.search.dnas.supernet.top_k) == (
        300, "auto", 2)
    assert Config().search.oneshot.supernet.steps == 600


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_an_old_key_is_refused_naming_the_new_one(old: str, tmp_path: Path) -> None:
    new = RENAMED[old]
    value = flatten(to_dict(Config()))[new]
    message = f"config key {old!r} is now {new!r}"
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(overrides=[f"{old}={value}"])
    f = tmp_path / "old.yaml"
    head, _, leaf = old.rpartition(".")
    nested: dict = {leaf: value}
    for part in reversed(head.split(".")):
        nested = {part: nested}
    f.write_text(yaml.safe_dump(nested))
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(f)
    assert flatten(to_dict(config_from_dict(rename_old_keys(nested))))[new] == value  # a logged config moves over


def test_an_old_key_on_the_command_line_exits_2_naming_the_new_one(tmp_path: Path, capsys) -> None:
    from rankitect.cli import main

    code = main(["search", "search.dnas.tau_start=3", f"track.uri=sqlite:///{tmp_path}/m.db"])
    assert code == 2
    assert "'search.dnas.tau_start' is now 'search.dnas.gumbel.tau_start'" in capsys.readouterr().err
    assert not (tmp_path / "m.db").exists()
