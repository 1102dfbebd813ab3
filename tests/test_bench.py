"""Every bench imports, and the quick ones run: a bench that no longer runs fails here, not when
someone next measures with it.

Each bench is a module ``bench.<group>.<name>`` with ``main(argv)``; ``--quick`` (bench/common.py)
runs it at the smallest size that goes through every part. The ones that take seconds run here, in
this process, on tiny synthetic data in a temporary data cache; the others (a cold ``torch.compile``,
searches in processes of their own, kill -9 rounds) are imported and their arguments parsed.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHES = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "bench").glob("*/*.py")
                 if p.name != "__init__.py")
RUN_QUICK = ("bench.speed.block_bench", "bench.speed.data_bench", "bench.speed.rocs_bench",
             "bench.speed.search_bench", "bench.quality.rocs_quality_bench", "bench.speed.history_rocs_bench")


def test_the_suite_is_what_the_docs_name() -> None:
    groups = {b.split(".")[1] for b in BENCHES}
    assert groups == {"speed", "quality", "faults"}, BENCHES
    assert set(RUN_QUICK) <= set(BENCHES)
    for group in groups:
        assert (ROOT / "bench" / group / "__init__.py").is_file()


@pytest.mark.parametrize("name", BENCHES)
def test_every_bench_imports_and_parses_quick(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    module = importlib.import_module(name)
    if not hasattr(module, "main"):  # a helper of another bench (nas_cost: the --cost part of nas_bench)
        return
    with pytest.raises(SystemExit) as done:
        module.main(["--quick", "--help"])
    assert done.value.code == 0
    assert "--quick" in capsys.readouterr().out


@pytest.mark.parametrize("name", RUN_QUICK)
def test_quick_benches_run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.chdir(tmp_path)  # anything a bench writes beside it lands here
    importlib.import_module(name).main(["--quick"])
    out = capsys.readouterr().out
    assert out.strip(), f"{name} printed nothing"
    assert "Traceback" not in out


def test_winner_rule_reads_the_lines_a_search_writes(tmp_path: Path) -> None:
    """The bench parses the runner's own closing lines (search.selection.Pick.lines): a winner that
    is the cheapest within the noise of a pricier best candidate, both against the best baseline."""
    from bench.quality import winner_rule
    from rankitect.eval.result import TrialResult
    from rankitect.search.judging.selection import Entrant, Pick

    def entrant(name: str, kind: str, val: float, test: float, mflops: float) -> Entrant:
        return Entrant(name, kind, TrialResult(val_ne=val, test_ne=test, mflops=mflops, params=1))

    base = entrant("dlrm", "baseline", 0.9230, 0.9188, 1.0)
    cheap, best = entrant("aa11", "candidate", 0.9218, 0.9165, 0.3), entrant("bb22", "candidate", 0.9210, 0.9174, 0.9)
    pick = Pick(winner=cheap, incumbent=base, z=1.4, best=best, top=(best, 2.1))
    log = tmp_path / "s" / "search.log"
    log.parent.mkdir()
    log.write_text("\n".join(["[1/16] aa11 ...", *pick.lines(1.0), "MLflow search run: x"]) + "\n")
    assert winner_rule.read(log) == (0.9188, 0.9165, 0.9174)
    winner_rule.main([str(tmp_path)])
