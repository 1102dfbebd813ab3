import json
import subprocess
import sys
from pathlib import Path

import pytest

from rankitect.cli import build_parser, main


def test_help_lists_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for name in ("data",):
        assert name in out
    actions = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(actions) >= {"data"}


def test_unknown_key_exits_2_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "synth"
    code = main(["data", "synth", "-o", str(out), "data.rowz=100"])
    assert code == 2
    assert "data.rowz" in capsys.readouterr().err
    assert not out.exists()


def test_wrong_type_exits_2_without_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rankitect", "data", "synth", "-o", str(tmp_path / "s"), "data.rows=many"],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "data.rows" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("line", [
    ["data.rows=0", "data", "synth", "data.rows=2000"],  # an override repeated, anywhere on the line
    ["data", "synth", "data.rows=2000", "data.rows=2000"],  # even with the same value: one was a slip
])
def test_a_key_given_twice_exits_2_naming_both_values(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      line: list[str]) -> None:
    out = tmp_path / "synth"
    code = main([*line, "-o", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    values = [a for a in line if a.startswith("data.rows=")]
    assert "'data.rows' given twice" in err and all(v in err for v in values)
    assert not out.exists()


def test_a_flag_and_an_override_of_one_key_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["search", "--trials", "3", "search.trials=5", f"track.uri=sqlite:///{tmp_path}/m.db"])
    assert code == 2
    err = capsys.readouterr().err
    assert "search.trials=3" in err and "search.trials=5" in err
    assert not list(tmp_path.iterdir())  # refused before a store or a search was made


def test_data_synth_then_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "synth"
    assert main(["data", "synth", "--rows", "2000", "--seed", "3", "-o", str(out)]) == 0
    assert (out / "meta.json").is_file()
    capsys.readouterr()
    assert main(["data", "inspect", str(out)]) == 0
    text = capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    rows = sum(s["rows"] for s in meta["splits"].values())
    assert rows == 2000
    for split in ("train", "val", "test"):
        assert split in text
    assert f"{meta['splits']['test']['bayes_ne']:.4f}"[:5] in text  # the Bayes NE is shown
    assert "request" in text and "candidate" in text  # feature sides


@pytest.mark.parametrize("make_bad", ["missing", "ragged", "letters", "empty"])
def test_bad_data_is_one_line_naming_file_and_line(tmp_path: Path, make_bad: str) -> None:
    path = tmp_path / "bad.tsv"
    good = "\t".join(["1"] + ["5"] * 13 + ["68fd1e64"] * 26)
    if make_bad == "ragged":
        path.write_text(good + "\n" + "\t".join(["0", "1", "2"]) + "\n")
    elif make_bad == "letters":
        path.write_text(good + "\n" + good.replace("\t5\t", "\tfive\t", 1) + "\n")
    elif make_bad == "empty":
        path.write_text("")
    proc = subprocess.run(
        [sys.executable, "-m", "rankitect", "data", "inspect", str(path), f"data.cache_dir={tmp_path / 'cache'}"],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and str(path) in proc.stderr
    if make_bad in ("ragged", "letters"):
        assert f"{path}:2" in proc.stderr


def test_console_script_and_module_run_the_same_main() -> None:
    import importlib
    import tomllib

    import rankitect.__main__ as module_entry
    import rankitect.cli

    root = Path(__file__).resolve().parents[1]
    target = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]["rankitect"]
    module, _, attr = target.partition(":")
    assert getattr(importlib.import_module(module), attr) is rankitect.cli.main
    assert module_entry.main is rankitect.cli.main


def test_every_command_module_is_on_the_line() -> None:
    """Each module of rankitect/cli that adds commands is listed, and every command has a handler."""
    import pkgutil

    import rankitect.cli as cli

    adding = {m.name for m in pkgutil.iter_modules(cli.__path__)
              if hasattr(__import__(f"rankitect.cli.{m.name}", fromlist=["x"]), "add_commands")}
    assert adding == {g.__name__.rpartition(".")[2] for g in cli.COMMAND_GROUPS}
    choices = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(choices) == {"search", "train", "runs", "export", "finetune", "probe", "ui", "data"}
    for name in set(choices) - {"data"}:
        assert callable(choices[name].get_default("handler")), name
