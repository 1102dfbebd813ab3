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
