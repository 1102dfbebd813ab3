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
