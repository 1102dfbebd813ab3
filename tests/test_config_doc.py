"""The config reference is generated from the config dataclasses and kept in step with them."""

from __future__ import annotations

import re
from pathlib import Path

from rankitect.config import Config, load_config

from rankitect.config_rules import flatten, to_dict
from rankitect.config_doc import default_yaml, markdown

ROOT = Path(__file__).resolve().parents[1]


def test_generated_files_are_up_to_date() -> None:
    hint = "run `python -m rankitect.config_doc` to regenerate"
    assert (ROOT / "docs" / "config.md").read_text() == markdown(), hint
    assert (ROOT / "configs" / "default.yaml").read_text() == default_yaml(), hint


def test_reference_lists_every_key_once_with_its_default() -> None:
    keys = re.findall(r"^\| `([\w.]+)` \|", markdown(), flags=re.M)
    assert sorted(keys) == sorted(flatten(to_dict(Config())))
    assert len(keys) == len(set(keys))


def test_default_yaml_spells_out_every_key_at_its_default(tmp_path: Path) -> None:
    path = tmp_path / "default.yaml"
    path.write_text(default_yaml())
    assert load_config(path) == Config()
    import yaml

    assert set(flatten(yaml.safe_load(default_yaml()))) == set(flatten(to_dict(Config())))
