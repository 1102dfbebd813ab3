"""The connection to one MLflow experiment that the writer and the reader of runs share.

Everything goes through an explicit ``mlflow.MlflowClient`` (no active-run globals), so worker
processes can log with a tracker of their own. MLflow is imported when a connection is made.

The experiment is tagged for model training (``mlflow.experimentKind``), not GenAI, and carries a
shared view of its runs table (:data:`~rankitect.track.names.VIEW_KEY`: the metric columns, best
test NE first) that :meth:`Experiment.runs_view_path` opens in MLflow's model-training UI.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankitect.track.names import EXPERIMENT_KIND, SEARCH, TEST_NE, VIEW_COLUMNS, VIEW_KEY, VIEW_TAG
from rankitect.track.location import artifact_root, resolve_uri

if TYPE_CHECKING:
    from mlflow import MlflowClient


@contextmanager
def _store_lock(root: Path | None) -> Iterator[None]:
    """An exclusive file lock beside a SQLite store (no-op for other stores)."""
    if root is None:
        yield
        return
    with open(root.parent / ".rankitect-store.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Experiment:
    """One MLflow experiment, opened (and created if new) through its own client.

    Args:
        uri: tracking URI; default ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlruns/mlflow.db``.
        experiment: experiment name, created if new. With a SQLite store its artifacts go to
            ``artifacts/`` beside the database file (``mlruns/artifacts`` by default).
    """

    def __init__(self, uri: str | None = None, experiment: str = "rankitect") -> None:
        from mlflow import MlflowClient

        self.uri = resolve_uri(uri)
        root = artifact_root(self.uri)
        if root is not None:
            root.parent.mkdir(parents=True, exist_ok=True)  # SQLite creates the file, not its folder
        with _store_lock(root):
            # Creating a SQLite store runs its schema migrations: two processes doing it at once
            # (a shared search starting) corrupt each other, so the first use is serialized.
            self.client: MlflowClient = MlflowClient(tracking_uri=self.uri)
            self._searches: dict[str, str] = {}  # parent run id -> its search's name
            self.experiment = experiment
            found = self.client.get_experiment_by_name(experiment)
            if found is not None:
                self.experiment_id = found.experiment_id
            else:
                location = None if root is None else root.as_uri()
                self.experiment_id = self.client.create_experiment(experiment, artifact_location=location)
            tags = {} if found is None else found.tags
            if tags.get(EXPERIMENT_KIND[0]) is None:
                self.client.set_experiment_tag(self.experiment_id, *EXPERIMENT_KIND)
            if tags.get(VIEW_TAG) != _view_state():  # new, or an older one
                self.client.set_experiment_tag(self.experiment_id, VIEW_TAG, _view_state())

    def runs_view_path(self) -> str:
        """The UI path (after ``http://host:port/``) of the experiment's runs in the model-training
        view, with the metric columns shown and the best test NE first."""
        return (f"#/experiments/{self.experiment_id}/runs?viewStateShareKey={VIEW_KEY}"
                "&workflowType=machine_learning")

    def _get_run(self, run_id: str) -> Any:
        """The MLflow run ``run_id``; an unknown id is a ``UserError`` naming it and the store."""
        from rankitect.errors import UserError

        try:
            return self.client.get_run(run_id)
        except Exception as e:  # noqa: BLE001 - MLflow raises its own exception types
            raise UserError(f"no run {run_id!r} in {self.uri} ({type(e).__name__})") from None

    def _find_runs(self, query: str) -> list[Any]:
        """Every run of the experiment that matches the MLflow search ``query``, page by page."""
        runs, token = [], None
        while True:
            page = self.client.search_runs([self.experiment_id], query, max_results=1000, page_token=token)
            runs += list(page)
            token = page.token
            if not token:
                return runs

    def _search_of(self, parent_id: str) -> str:
        """The search name of the runs under ``parent_id`` (its tag :data:`SEARCH`, else its name)."""
        if parent_id not in self._searches:
            run = self._get_run(parent_id)
            self._searches[parent_id] = run.data.tags.get(SEARCH) or run.info.run_name
        return self._searches[parent_id]


def _view_state() -> str:
    """The shared runs-table view (MLflow's persisted UI state): metric columns, best test NE first,
    the runs grouped by their search (tag :data:`SEARCH`), every group expanded."""
    columns = [f"metrics.`{m}`" for m in VIEW_COLUMNS]
    # Grouped by search (its tag on every run of it), each group's row showing the best of its runs:
    # MLflow nests child runs under their parent only when ordered by start time, and collapsed.
    group = {"aggregateFunction": "min", "groupByKeys": [{"mode": "tag", "groupByData": SEARCH}]}
    return json.dumps({"searchFilter": "", "orderByKey": f"metrics.`{TEST_NE}`", "orderByAsc": True,
                       "selectedColumns": ["attributes.`Source`", *columns], "runsHiddenMode": "SHOW_ALL",
                       "groupBy": group})
