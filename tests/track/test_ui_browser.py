"""`rankitect ui` seen in a real browser: headless Chromium renders the MLflow UI of a finished search.

MLflow's UI (3.17) is a React app: the HTML the server sends holds no run at all, so each page is
rendered by Chromium (``--dump-dom`` after a ``--virtual-time-budget``, which waits for the page's
API calls) and the checks read the rendered DOM:

- the runs list as ``rankitect ui`` prints it (the model-training view, ``workflowType=machine_learning``,
  with the experiment's shared view ``viewStateShareKey=rankitect``) shows ``test/ne`` and ``mflops``
  columns holding every candidate's values at full precision, grouped under their search, best test
  NE first;
- the compare page of 3 candidates (``#/compare-runs?runs=[...]``) lists their architecture choices
  as parameters (``b0.flat``, ...) with each candidate's own values, beside their metrics;
- the experiment's runs table, filtered to the search's children through the URL
  (``#/experiments/<id>/runs?searchFilter=...&orderByKey=...``), names every candidate and baseline;
- the search run's page (``#/experiments/<id>/runs/<run_id>``) names it and lists its child runs;
- each child run's page has a Metric / Value table (ARIA ``role="row"`` / ``role="cell"``) holding
  ``test/ne`` and ``mflops`` at full precision: they must equal what MLflow's client returns.

A screenshot of every page goes to ``artifacts/ui-browser/`` at the repository root, with the
server's log.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote, urlencode

import pytest

from rankitect.cli import main
from tests.learnable import learnable_source

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "ui-browser"
SEARCH = [
    "search", "--strategy", "random", "--trials", "3", "train.max_epochs=2", f"data.source={learnable_source()}",
    "train.batch_size=64",
    "train.test_batches=2", "search.pruning=none", "search.baselines=[dlrm]", "runtime.threads=1", "search.workers=1",
    "train.grace_steps=64",  # both epochs before a model may be ended as diverged: every candidate has a test NE
]
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
    "--window-size=1600,1300",  # tall enough that a run page's metrics table is in the screenshot
]
SERVER_START_S = 240  # the UI server imports MLflow's whole app: slow on a loaded 2-core machine
BUDGETS_MS = (15_000, 30_000, 60_000)  # virtual time per render; a retry waits longer


def _chromium() -> str:
    path = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if path is None:
        pytest.fail("chromium is not installed: this test renders `rankitect ui` in headless Chromium. "
                    "`make install` installs Debian's package (apt-get install chromium); run it as root.")
    return path


class _Page(HTMLParser):
    """The visible text of a rendered page and its ARIA table rows (``[[cell text, ...], ...]``)."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self, html: str) -> None:
        super().__init__()
        self.stack: list[tuple[str, str | None]] = []
        self.rows: list[list[str]] = []
        self.words: list[str] = []
        self.feed(html)
        self.text = " ".join(self.words)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.VOID:
            return
        role = dict(attrs).get("role")
        self.stack.append((tag, role))
        if role == "row":
            self.rows.append([])
        elif role == "cell" and self.rows:
            self.rows[-1].append("")

    def handle_endtag(self, tag: str) -> None:
        while self.stack and self.stack.pop()[0] != tag:
            pass  # close elements the DOM serializer left implicit

    def handle_data(self, data: str) -> None:
        if any(t in ("script", "style") for t, _ in self.stack) or not data.strip():
            return
        self.words.append(data.strip())
        if self.rows and self.rows[-1] and any(r == "cell" for _, r in self.stack):
            self.rows[-1][-1] += data.strip()

    def table(self) -> dict[str, str]:
        """Two-cell rows as ``{first cell: second cell}`` (a run page's metrics, params)."""
        return {r[0]: r[1] for r in self.rows if len(r) == 2}


def _render(chromium: str, url: str, shot: Path, ready: Callable[[_Page], bool]) -> _Page:
    """Render ``url``, save a screenshot, return the page once ``ready`` holds (a few tries)."""
    page = _Page("")
    for budget in BUDGETS_MS:
        profile = shot.with_suffix(".profile")  # a fresh profile per render: no state carried over
        shutil.rmtree(profile, ignore_errors=True)
        argv = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={budget}",
                f"--screenshot={shot}", "--dump-dom", url]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
        shutil.rmtree(profile, ignore_errors=True)
        page = _Page(done.stdout)
        if ready(page):
            return page
    return page


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_server(proc: subprocess.Popen, base: str, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"`rankitect ui` exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    pytest.fail(f"`rankitect ui` did not answer within {SERVER_START_S} s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    """End the server's whole process group (`rankitect ui` -> mlflow -> uvicorn workers)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # what outlived SIGTERM (workers mid-shutdown)
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.fixture(scope="module")
def search(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A tiny finished search in a fresh SQLite store; its runs as MLflow's client sees them (one
    search and one UI server for this module's pages: they only read the store)."""
    tmp_path = tmp_path_factory.mktemp("ui")
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("RANKITECT_DATA_DIR", str(tmp_path / "data"))
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        monkeypatch.chdir(tmp_path)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(SEARCH) == 0
        yield _runs(uri, out.getvalue().split("MLflow search run: ")[1].split()[0], tmp_path)


def _runs(uri: str, parent_id: str, folder: Path) -> dict:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    parent = client.get_run(parent_id)
    children = client.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'")
    kinds = sorted(c.data.tags["rankitect.kind"] for c in children)
    assert kinds == ["baseline", "candidate", "candidate", "candidate"]
    return {"uri": uri, "parent": parent, "children": list(children), "folder": folder}


@pytest.fixture(scope="module")
def server(search: dict) -> Iterator[str]:
    """`rankitect ui` on a free local port, stopped by its process group whatever happens."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    # one worker and no job consumers: the store is tiny, and the machine has 2 cores
    env = {**os.environ, "MLFLOW_TRACKING_URI": search["uri"], "MLFLOW_WORKERS": "1",
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "PYTHONUNBUFFERED": "1"}
    log = ARTIFACTS / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rankitect", "ui", "--port", str(port)], env=env,
                                cwd=search["folder"], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_server(proc, base, log)
        yield base
    finally:
        _stop(proc)


def _is_png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 10_000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_runs_list_in_the_model_training_view_and_a_compare_view_of_three_candidates(search: dict, server: str) -> None:
    from rankitect.track import Tracker

    chromium = _chromium()
    view = Tracker(search["uri"]).runs_view_path()
    assert "workflowType=machine_learning" in view
    cands = [c for c in search["children"] if c.data.tags["rankitect.kind"] == "candidate"]
    names = [c.info.run_name for c in search["children"]]
    values = [repr(c.data.metrics[m]) for c in search["children"] for m in ("test/ne", "mflops")]
    page = _render(chromium, f"{server}/{view}", ARTIFACTS / "runs_list.png",
                   lambda p: all(v in p.text for v in values))
    assert "Model registry" in page.text  # the model-training sidebar (the GenAI one has none)
    assert "test/ne" in page.words and "mflops" in page.words, page.text[:1500]  # column headers
    missing = [v for v in values if v not in page.text]
    assert not missing, f"runs list lacks the metric values {missing}: {page.text[:2000]}"
    assert all(n in page.text for n in names)
    # grouped by search: the group's row (the search's name) first, then its runs, best test NE first
    first = page.text.index(search["parent"].info.run_name)
    assert all(page.text.index(n) > first for n in names), page.text[:2000]
    by_ne = sorted(search["children"], key=lambda c: c.data.metrics["test/ne"])
    order = [page.text.index(c.info.run_name) for c in by_ne]
    assert order == sorted(order)  # best test NE first

    ids = json.dumps([c.info.run_id for c in cands])
    exp = json.dumps([search["parent"].info.experiment_id])
    url = f"{server}/#/compare-runs?{urlencode({'runs': ids, 'experiments': exp}, quote_via=quote)}"
    choices = sorted(k for k in cands[0].data.params if k != "genotype_hash")
    assert len(choices) > 10  # every architecture choice is a parameter of the candidate
    page = _render(chromium, url, ARTIFACTS / "compare_3.png",
                   lambda p: "Parameters" in p.text and choices[0] in p.text)
    assert "Comparing 3 Runs" in page.text, page.text[:1500]
    words = page.words[len(page.words) - page.words[::-1].index("Parameters"):]  # the parameters table
    for label in choices:
        assert label in words, f"compare view lacks parameter {label}: {page.text[:2000]}"
        if all(label in c.data.params for c in cands):
            i = words.index(label)
            assert words[i + 1:i + 4] == [c.data.params[label] for c in cands], (label, words[i:i + 4])


@pytest.mark.slow
def test_search_runs_and_metrics_render_in_chromium(search: dict, server: str) -> None:
    chromium = _chromium()
    parent, children = search["parent"], search["children"]
    exp, pid = parent.info.experiment_id, parent.info.run_id
    names = [c.info.run_name for c in children]

    query = urlencode({"searchFilter": f"tags.`mlflow.parentRunId` = '{pid}'",
                       "orderByKey": "metrics.`test/ne`", "orderByAsc": "true"}, quote_via=quote)
    table = _render(chromium, f"{server}/#/experiments/{exp}/runs?{query}", ARTIFACTS / "runs_table.png",
                    lambda p: all(n in p.text for n in names))
    missing = [n for n in names if n not in table.text]
    assert not missing, f"runs table lacks {missing}; it shows: {table.text[:1500]}"

    page = _render(chromium, f"{server}/#/experiments/{exp}/runs/{pid}", ARTIFACTS / "search_run.png",
                   lambda p: "Child runs" in p.text and all(n in p.text for n in names))
    assert parent.info.run_name in page.text and "Child runs" in page.text, page.text[:1500]
    assert all(n in page.text for n in names), f"child runs {names} not listed: {page.text[:1500]}"
    assert page.table().get("search.strategy") == "random"  # the params table of the search run

    for child in children:
        shot = ARTIFACTS / f"run_{child.info.run_name}.png"
        page = _render(chromium, f"{server}/#/experiments/{exp}/runs/{child.info.run_id}", shot,
                       lambda p: {"test/ne", "mflops"} <= p.table().keys())
        shown = page.table()
        assert child.info.run_name in page.text and parent.info.run_name in page.text, page.text[:1500]
        for metric in ("test/ne", "mflops"):
            assert metric in shown, f"{child.info.run_name}: no {metric} in {json.dumps(shown)[:1500]}"
            assert float(shown[metric]) == pytest.approx(child.data.metrics[metric], rel=1e-12)
        assert _is_png(shot), shot
