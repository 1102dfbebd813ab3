"""A thin layer over MLflow: a search is a parent run, every candidate a child run.

Everything goes through an explicit ``mlflow.MlflowClient`` (no active-run globals), so worker
processes can log with a :class:`Tracker` of their own. MLflow is imported when a tracker is made.

The experiment is tagged for model training (``mlflow.experimentKind``), not GenAI, and carries a
shared view of its runs table (:data:`VIEW_KEY`: the metric columns, best test NE first) that
:meth:`Tracker.runs_view_path` opens in MLflow's model-training UI.

Parent run (named by strategy, space, data and start time; tags ``rankitect.kind=search``,
``rankitect.strategy``, ``rankitect.space``, ``rankitect.data``, and ``rankitect.search``, its
name, which every run of the search carries too: the shared view groups the runs list by it): the flattened config as params
(long values cut, the full config in ``config.yaml``), ``space.json``, and at the end
``pareto.csv``, ``pareto.png`` (also an MLflow image, key ``pareto``, among the run's charts), the
Pareto table as an MLflow table (``pareto.json``), ``best_genotype.json``, ``search_state.json``,
the winner's metrics under the candidates' names and its name as tag ``rankitect.winner``. Child run (tag ``mlflow.parentRunId``; ``rankitect.kind`` is ``candidate``,
``baseline`` or ``finetune``): params ``genotype_hash``, the recipe genes (``recipe.*``) and every
architecture choice under the
space's flat label (``b0.flat``, ``b0.width``, ...), metrics ``val/ne`` (also at every validation
step), ``test/ne``, ``test/auc``, ``test/logloss``, ``mflops``, ``params``, ``train_seconds``,
artifact ``genotype.json``; its real start and end times; tag ``rankitect.status`` (``ok``,
``failed``, ``pruned``); status FINISHED, FAILED with the message in the ``error`` tag, or KILLED
for a trial the search's successive halving stopped early. One name per metric: a search run's
``test/ne`` is its winner's.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import yaml

from rankitect.config import flatten
from rankitect.track.store import artifact_root, resolve_uri
from rankitect.track.weights import LEGACY_WEIGHTS_FILE, WEIGHTS_FILE, save_weights

if TYPE_CHECKING:
    from mlflow import MlflowClient

KIND, STRATEGY, SPACE, DATA = "rankitect.kind", "rankitect.strategy", "rankitect.space", "rankitect.data"
WINNER = "rankitect.winner"  # on a search run: its winner's name (a baseline's name or a genotype hash)
SEARCH = "rankitect.search"  # on a search run and all its runs: the search's name (the view groups by it)
FAILURE = "rankitect.failure"  # why a search run ended FAILED (Tracker.fail_run)
PARENT = "mlflow.parentRunId"
MAX_PARAM_CHARS = 500  # MLflow allows 6000, but the UI's params table is unreadable long before
MAX_TAG_CHARS = 8000  # MLflow's limit on a tag value
MODEL_DIR, SPEC_FILE = "model", "feature_spec.json"
# The logged pyfunc's name: not MODEL_DIR, since MLflow serves a run's artifact path from the run's
# logged model of that name first, and ``model/`` must stay the kept weights that export reads.
SCORER_MODEL = "scorer"
METRICS = {  # metric name -> TrialResult attribute
    "val/ne": "val_ne", "test/ne": "test_ne", "test/auc": "test_auc", "test/logloss": "test_logloss",
    "mflops": "mflops", "params": "params", "train_seconds": "train_seconds",
}
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")  # MLflow's model-training UI
VIEW_KEY = "rankitect"  # the experiment's shared runs-table view: tag mlflow.sharedViewState.<key>
VIEW_COLUMNS = ("test/ne", "val/ne", "test/auc", "mflops", "params", "train_seconds")
WINNER_METRICS = {"val/ne": "val_ne", "test/ne": "test_ne", "test/auc": "test_auc", "mflops": "mflops",
                  "objective": "objective"}  # metric name -> Pareto table column


# A trial's status -> its MLflow run status. A pruned trial was stopped early by the search's
# successive halving: KILLED (ended before its natural end), with tag rankitect.status=pruned.
RUN_STATUS = {"ok": "FINISHED", "failed": "FAILED", "pruned": "KILLED"}


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _recipe_params(arch: Any) -> dict[str, str]:
    """The genotype's recipe, dropout and norm genes as run params (none for a bare genotype)."""
    if not hasattr(arch, "recipe"):
        return {}
    from rankitect.space.recipe import recipe_params  # the space package pulls in torch: only when used

    return {k: str(v) for k, v in recipe_params(arch).items()}


def _genotype_text(arch: Any) -> str:
    return json.dumps(json.loads(arch.to_json()), indent=2, sort_keys=True)


def _hash_of(arch: Any) -> str:
    h = arch.hash
    return str(h() if callable(h) else h)


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


@dataclass(frozen=True)
class ModelFiles:
    """Local copies of what a run keeps of a trained model."""

    run_id: str
    genotype: Path
    weights: Path
    spec: Path


class Tracker:
    """Logs searches and their candidates to one MLflow experiment.

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
            if tags.get(f"mlflow.sharedViewState.{VIEW_KEY}") != _view_state():  # new, or an older one
                self.client.set_experiment_tag(self.experiment_id, f"mlflow.sharedViewState.{VIEW_KEY}", _view_state())

    def runs_view_path(self) -> str:
        """The UI path (after ``http://host:port/``) of the experiment's runs in the model-training
        view, with the metric columns shown and the best test NE first."""
        return (f"#/experiments/{self.experiment_id}/runs?viewStateShareKey={VIEW_KEY}"
                "&workflowType=machine_learning")

    def start_search(self, config: dict[str, Any], strategy: Any, space: Any, *, name: str | None = None) -> str:
        """Open the parent run of a search; returns its run id.

        ``strategy`` and ``space`` are names or objects (a strategy's ``name``; a space's ``name``
        and ``to_dict()``, logged as ``space.json``).
        """
        strategy_name = strategy if isinstance(strategy, str) else strategy.name
        space_name = space if isinstance(space, str) else getattr(space, "name", type(space).__name__)
        source = str((config.get("data") or {}).get("source") or "")
        started = time.time()
        # a name that tells searches apart in MLflow's list and in `rankitect runs`
        default = "-".join(p for p in (strategy_name, space_name, data_name(source),
                                        time.strftime("%Y%m%d-%H%M%S", time.localtime(started))) if p)
        tags = {KIND: "search", STRATEGY: strategy_name, SPACE: space_name, SEARCH: name or default}
        if source:
            tags[DATA] = _cut(source, MAX_TAG_CHARS)
        run = self.client.create_run(self.experiment_id, run_name=name or default, tags=tags,
                                     start_time=int(started * 1000))
        run_id = run.info.run_id
        self._log(run_id, params={k: _cut(str(v), MAX_PARAM_CHARS) for k, v in flatten(config).items()})
        self.client.log_text(run_id, yaml.safe_dump(config, sort_keys=False), "config.yaml")
        if not isinstance(space, str) and hasattr(space, "to_dict"):
            self.client.log_dict(run_id, space.to_dict(), "space.json")
        return run_id

    def _search_of(self, parent_id: str) -> str:
        """The search name of the runs under ``parent_id`` (its tag :data:`SEARCH`, else its name)."""
        if parent_id not in self._searches:
            run = self._get_run(parent_id)
            self._searches[parent_id] = run.data.tags.get(SEARCH) or run.info.run_name
        return self._searches[parent_id]

    def log_trial(
        self, parent_id: str | None, arch: Any, result: Any, extra_tags: dict[str, str] | None = None,
        *, baseline: str | None = None, params: dict[str, Any] | None = None, start_time: float | None = None,
        end_time: float | None = None, history: list[dict[str, float]] | None = None, status: str | None = None,
    ) -> str:
        """Log one finished (or failed) candidate, or the baseline ``baseline``, as a child run.

        ``result`` is a ``rankitect.search.TrialResult`` (or has its attributes); returns the run id.
        Without ``parent_id`` the run stands alone (``rankitect train``). ``params``: more run
        parameters (the architecture choices, the data settings); ``start_time`` and ``end_time``:
        when the trial itself started and ended (``time.time()``; default: it ended now and started
        its training seconds before), so the run's duration in MLflow is the trial's own, not the
        time it waited to be recorded;
        ``history``: the validation metrics at each step (``{"step": s, "val/ne": ...}``), logged
        under their own names at their steps, before the final values at the last step. ``status``
        (default: by the result's status, see :data:`RUN_STATUS`) may be KILLED: a trial its
        search was stopped in.
        """
        h = _hash_of(arch)
        tags = {KIND: "baseline" if baseline else "candidate", "genotype_hash": h}
        if parent_id is not None:
            tags[PARENT], tags[SEARCH] = parent_id, self._search_of(parent_id)
        tags["rankitect.status"] = result.status
        if result.error:
            tags["error"] = _cut(str(result.error), MAX_TAG_CHARS)
        tags.update({k: str(v) for k, v in (extra_tags or {}).items()})
        end = end_time if end_time is not None else time.time()
        start = start_time if start_time is not None else end - float(result.train_seconds or 0.0)
        run = self.client.create_run(self.experiment_id, run_name=baseline or h, tags=tags,
                                     start_time=int(start * 1000))
        run_id = run.info.run_id
        metrics = {k: float(getattr(result, a)) for k, a in METRICS.items() if getattr(result, a) is not None}
        # The recipe genes as the model has them (a width choice of None is D) over the space's labels.
        every = {"genotype_hash": h, **{k: _cut(str(v), MAX_PARAM_CHARS) for k, v in (params or {}).items()},
                 **_recipe_params(arch)}
        self._log_history(run_id, history or [], start, end)
        last = max((int(p["step"]) for p in history or []), default=0)
        self._log(run_id, params=every, metrics=metrics, step=last)
        self.client.log_text(run_id, _genotype_text(arch), "genotype.json")
        self.client.set_terminated(run_id, status or RUN_STATUS[result.status], end_time=int(end * 1000))
        return run_id

    def _log_history(self, run_id: str, history: list[dict[str, float]], start: float, end: float) -> None:
        """Validation curves under the metrics' own names, stamped between the run's start and end."""
        from mlflow.entities import Metric

        last = max((p["step"] for p in history), default=1) or 1
        stamp = lambda step: int((start + (end - start) * min(step / last, 1.0)) * 1000) - 1  # noqa: E731
        points = [Metric(k, float(v), stamp(p["step"]), int(p["step"])) for p in history
                  for k, v in p.items() if k != "step"]
        for i in range(0, len(points), 1000):
            self.client.log_batch(run_id, metrics=points[i:i + 1000])

    def log_model_files(self, run_id: str, weights: str | Path, spec_file: str | Path) -> None:
        """Attach trained weights and the feature spec to a run as ``model/model.safetensors`` (see
        :func:`~rankitect.track.weights.save_weights`) and ``model/feature_spec.json`` (what
        export, finetune and probe read back). The run's artifact store holds the only copy."""
        if Path(weights).suffix != ".safetensors":
            raise ValueError(f"{weights}: kept weights are safetensors files")
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / MODEL_DIR
            folder.mkdir()
            shutil.copyfile(weights, folder / WEIGHTS_FILE)
            shutil.copyfile(spec_file, folder / SPEC_FILE)
            self.client.log_artifacts(run_id, str(folder), MODEL_DIR)

    def log_model(self, run_id: str, state_dict: Mapping[str, Any], spec: Any) -> None:
        """Attach a model's weights (a state dict) and its ``FeatureSpec`` to a run, as
        :meth:`log_model_files` does with files."""
        with tempfile.TemporaryDirectory() as tmp:
            weights = save_weights(state_dict, Path(tmp) / WEIGHTS_FILE)
            spec.save(Path(tmp) / SPEC_FILE)
            self.log_model_files(run_id, weights, Path(tmp) / SPEC_FILE)

    def delete_model_files(self, run_id: str) -> None:
        """Remove what :meth:`log_model_files` attached to a run (a candidate no longer kept)."""
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        repo = get_artifact_repository(self.client.get_run(run_id).info.artifact_uri)
        if any(f.path == MODEL_DIR for f in repo.list_artifacts()):
            repo.delete_artifacts(MODEL_DIR)

    def fetch_model_files(self, run_id: str, dst: str | Path) -> ModelFiles:
        """Download a run's genotype, weights and feature spec into ``dst``.

        A search (parent) run stands for its winner. Raises ``UserError`` naming the run when
        something is missing.
        """
        from rankitect.errors import UserError

        run = self._get_run(run_id)
        if run.data.tags.get(KIND) == "search":
            run = self._winner_of(run)
        rid = run.info.run_id
        dst = Path(dst)
        try:
            genotype = self.client.download_artifacts(rid, "genotype.json", str(dst))
            folder = self.client.download_artifacts(rid, MODEL_DIR, str(dst))
        except Exception as e:  # noqa: BLE001 - MLflow raises its own exception types
            raise UserError(f"run {rid}: no trained weights were kept for it (only the top candidates "
                            f"and the baselines keep theirs): {type(e).__name__}") from None
        weights = Path(folder) / WEIGHTS_FILE
        if not weights.is_file():
            weights = Path(folder) / LEGACY_WEIGHTS_FILE
        return ModelFiles(rid, Path(genotype), weights, Path(folder) / SPEC_FILE)

    def get_run(self, run_id: str) -> Any:
        """The MLflow run ``run_id``; an unknown id is a ``UserError`` naming it and the store."""
        return self._get_run(run_id)

    def logged_settings(self, run_id: str, section: str) -> tuple[dict[str, str], str]:
        """The ``section.*`` params (``data``: the data settings) logged on ``run_id`` or, for a
        candidate that has none, on the nearest run above it; keys without the ``section.``
        prefix. Also returns the id of the run that holds them; ``({}, run_id)`` when no run does."""
        prefix = f"{section}."
        run = holder = self._get_run(run_id)
        while not any(k.startswith(prefix) for k in holder.data.params) and holder.data.tags.get(PARENT):
            holder = self._get_run(holder.data.tags[PARENT])
        found = {k[len(prefix):]: v for k, v in holder.data.params.items() if k.startswith(prefix)}
        return (found, holder.info.run_id) if found else ({}, run.info.run_id)

    def fetch_search_artifact(self, run_id: str, kind: str, artifact_path: str, dst: str | Path) -> Path | None:
        """Download ``artifact_path`` of the run tagged ``rankitect.kind=kind`` in the search of
        ``run_id`` (the search itself or one of its runs) into ``dst``, e.g. the supernet that a
        oneshot or dnas search kept. ``None`` when the search has no such run."""
        run = self._get_run(run_id)
        search_id = run_id if run.data.tags.get(KIND) == "search" else run.data.tags.get(PARENT)
        if not search_id:
            return None
        found = self._find_runs(f"tags.`{PARENT}` = '{search_id}' and tags.`{KIND}` = '{kind}'")
        if not found:
            return None
        return Path(self.client.download_artifacts(found[0].info.run_id, artifact_path, str(dst)))

    def _get_run(self, run_id: str) -> Any:
        from rankitect.errors import UserError

        try:
            return self.client.get_run(run_id)
        except Exception as e:  # noqa: BLE001 - MLflow raises its own exception types
            raise UserError(f"no run {run_id!r} in {self.uri} ({type(e).__name__})") from None

    def _winner_of(self, search_run: Any) -> Any:
        from rankitect.errors import UserError

        h = search_run.data.tags.get("best_genotype_hash")
        query = f"tags.`{PARENT}` = '{search_run.info.run_id}' and tags.genotype_hash = '{h}'"
        found = [r for r in self._find_runs(query)
                 if r.data.tags.get(KIND) in ("candidate", "baseline") and r.info.status == "FINISHED"] if h else []
        if not found:
            raise UserError(f"search run {search_run.info.run_id} has no winner (not finished, or every trial failed)")
        return found[0]

    def log_raw_rows_model(self, run_id: str, export_dir: str | Path) -> str:
        """Log an export directory as an MLflow pyfunc model of run ``run_id`` (under "Logged
        models", in this tracker's experiment): ``predict`` takes a DataFrame of raw feature columns,
        every one of them (``params={"allow_missing": True}`` to score absent ones as missing).
        Returns the model URI."""
        import mlflow
        import torch
        from mlflow.models.signature import ModelSignature
        from mlflow.tracking._tracking_service import utils as tracking_utils
        from mlflow.types.schema import ParamSchema, ParamSpec

        code = Path(__file__).with_name("raw_rows_model.py")
        # The logged model is made here, in this tracker's experiment: left to Model.log it goes to
        # MLflow's active experiment, the Default one, whose artifacts live in ./mlruns of whatever
        # directory the command runs in. Its files then go under this experiment's artifact root.
        model = self.client.create_logged_model(self.experiment_id, name=SCORER_MODEL, source_run_id=run_id)
        # Model.log reads MLflow's global tracking URI (which set_tracking_uri also writes to the
        # environment): set it for the call, then put both back as they were, so no later Tracker or
        # client of this process is steered to this store.
        previous, env = tracking_utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
        mlflow.set_tracking_uri(self.uri)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # MLflow's advice on predict's type hints: the input is a DataFrame
                info = mlflow.models.Model.log(
                    None, mlflow.pyfunc, name=SCORER_MODEL, run_id=run_id, model_id=model.model_id,
                    python_model=str(code), artifacts={"export": str(export_dir)},
                    # no input schema (raw columns of any dtype); the one inference parameter
                    signature=ModelSignature(params=ParamSchema([ParamSpec("allow_missing", "boolean", False)])),
                    pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", f"mlflow=={mlflow.__version__}"])
        finally:
            mlflow.set_tracking_uri(previous)
            if env is None:
                os.environ.pop("MLFLOW_TRACKING_URI", None)
            else:
                os.environ["MLFLOW_TRACKING_URI"] = env
        return info.model_uri

    def log_metrics(self, run_id: str, metrics: dict[str, float]) -> None:
        """Log ``metrics`` (name -> value) on run ``run_id`` at step 0."""
        self._log(run_id, metrics=metrics)

    def log_per_step(self, run_id: str, name: str, values: Sequence[float]) -> None:
        """Log the metric ``name`` on run ``run_id`` once per step: ``values[i]`` at step ``i``."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        points = [Metric(name, float(v), now, i) for i, v in enumerate(values)]
        for i in range(0, len(points), 1000):
            self.client.log_batch(run_id, metrics=points[i:i + 1000])

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path)

    def log_dict(self, run_id: str, data: dict[str, Any], artifact_file: str) -> None:
        self.client.log_dict(run_id, data, artifact_file)

    def log_figure(self, run_id: str, figure: Any, artifact_file: str) -> None:
        self.client.log_figure(run_id, figure, artifact_file)

    def finish_search(
        self, parent_id: str, pareto_df: pd.DataFrame, best_arch: Any | None, state: dict[str, Any],
        *, status: str = "FINISHED", plot_title: str = "", floor: float | None = None,
    ) -> None:
        """Close the parent run with the Pareto table and plot, the winner and the search state.

        ``pareto_df`` is a ``rankitect.eval.pareto.pareto_table``; its ``winner`` row gives the
        ``best/*`` metrics. ``status``: ``FINISHED``, ``FAILED`` or ``KILLED``. ``plot_title`` and
        ``floor`` (the Bayes-optimal NE, when the data knows it) go to the Pareto plot.
        """
        from rankitect.eval.pareto import plot_pareto

        if len(pareto_df):
            self.client.log_table(parent_id, data=_table_safe(pareto_df), artifact_file="pareto.json")
        with tempfile.TemporaryDirectory() as tmp:
            pareto_df.to_csv(Path(tmp) / "pareto.csv", index=False)
            self.client.log_artifact(parent_id, str(Path(tmp) / "pareto.csv"))
            if len(pareto_df):
                png = plot_pareto(pareto_df, Path(tmp) / "pareto.png", title=plot_title, floor=floor)
                self.client.log_artifact(parent_id, str(png))
                self._log_chart(parent_id, png)
        self.client.log_dict(parent_id, state, "search_state.json")
        if best_arch is not None:
            self.client.log_text(parent_id, _genotype_text(best_arch), "best_genotype.json")
            self.client.set_tag(parent_id, "best_genotype_hash", _hash_of(best_arch))
        winner = pareto_df[pareto_df["winner"]] if "winner" in pareto_df else pareto_df.iloc[:0]
        if len(winner):
            row = winner.iloc[0]
            metrics = {k: float(row[c]) for k, c in WINNER_METRICS.items() if c in row and pd.notna(row[c])}
            self._log(parent_id, metrics=metrics)
            self.client.set_tag(parent_id, WINNER, str(row["name"]))
        self.client.set_terminated(parent_id, status)

    def _log_chart(self, run_id: str, png: Path) -> None:
        """The NE-vs-FLOPs plot as an MLflow image of the run (key ``pareto``): shown among the
        run's charts, beside the ``pareto.png`` artifact."""
        import numpy as np
        from matplotlib.image import imread

        image = (np.clip(imread(png)[..., :3], 0.0, 1.0) * 255).round().astype(np.uint8)  # (H, W, 3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # MLflow's notes on image formats
            self.client.log_image(run_id, image, key="pareto", step=0)

    def runs_table(self, parent_id: str | None = None) -> pd.DataFrame:
        """Candidate and baseline runs of one search (or of the whole experiment), best test NE first.

        ``status`` is the trial's own (``ok``, ``failed``, ``pruned``: stopped early by the search),
        or MLflow's where a run has none (``running``, ``killed``); ``winner`` marks the search's winner."""
        if parent_id is not None and not parent_id.isalnum():
            from rankitect.errors import UserError

            raise UserError(f"{parent_id!r} is not an MLflow run id (letters and digits; a setting is key=value)")
        query = f"tags.`{PARENT}` = '{parent_id}'" if parent_id else f"tags.`{KIND}` != 'search'"
        winners = self._winners(parent_id)
        rows = []
        for run in self._find_runs(query):
            m, t = run.data.metrics, run.data.tags
            rows.append({
                "run_id": run.info.run_id, "parent_id": t.get(PARENT), "kind": t.get(KIND),
                "name": run.info.run_name, "genotype_hash": t.get("genotype_hash"),
                "status": _trial_status(run), "winner": _is_winner(run, winners.get(t.get(PARENT))),
                **{k: m.get(k, math.nan) for k in METRICS}, "error": t.get("error"),
            })
        columns = ["run_id", "parent_id", "kind", "name", "genotype_hash", "status", "winner", *METRICS, "error"]
        df = pd.DataFrame(rows, columns=columns)
        return df.sort_values("test/ne", kind="stable", na_position="last").reset_index(drop=True)

    def _winners(self, parent_id: str | None) -> dict[str, tuple[str | None, str | None]]:
        """Search run id -> (winner's name, winner's genotype hash) of one search or of all."""
        runs = [self._get_run(parent_id)] if parent_id else self._find_runs(f"tags.`{KIND}` = 'search'")
        return {r.info.run_id: (r.data.tags.get(WINNER), r.data.tags.get("best_genotype_hash")) for r in runs}

    def searches_table(self) -> pd.DataFrame:
        """The searches (parent runs) of the experiment, newest first, with their data and winner."""
        rows = [{
            "run_id": r.info.run_id, "name": r.info.run_name, "strategy": r.data.tags.get(STRATEGY),
            "space": r.data.tags.get(SPACE), "data": r.data.tags.get(DATA) or r.data.params.get("data.source"),
            "status": r.info.status, "start_time": pd.to_datetime(r.info.start_time, unit="ms").floor("s"),
            "winner": r.data.tags.get(WINNER) or r.data.tags.get("best_genotype_hash"),
            "test/ne": r.data.metrics.get("test/ne", math.nan),
            "mflops": r.data.metrics.get("mflops", math.nan),
        } for r in self._find_runs(f"tags.`{KIND}` = 'search'")]
        df = pd.DataFrame(rows, columns=["run_id", "name", "strategy", "space", "data", "status", "start_time",
                                         "winner", "test/ne", "mflops"])
        return df.sort_values("start_time", ascending=False, kind="stable").reset_index(drop=True)

    def _find_runs(self, query: str) -> list[Any]:
        runs, token = [], None
        while True:
            page = self.client.search_runs([self.experiment_id], query, max_results=1000, page_token=token)
            runs += list(page)
            token = page.token
            if not token:
                return runs

    # --- what a search asks of its runs (rankitect.search, rankitect.supernet) -------------------

    def start_child_run(self, parent_id: str, name: str, kind: str) -> str:
        """A child run of the search ``parent_id`` tagged ``rankitect.kind=kind`` (e.g. ``supernet``)."""
        run = self.client.create_run(self.experiment_id, run_name=name,
                                     tags={KIND: kind, PARENT: parent_id, SEARCH: self._search_of(parent_id)})
        return run.info.run_id

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        """Close run ``run_id`` as ``FINISHED``, ``FAILED`` or ``KILLED``."""
        self.client.set_terminated(run_id, status)

    def fail_run(self, run_id: str, reason: str) -> None:
        """Close run ``run_id`` as ``FAILED`` with ``reason`` as its ``rankitect.failure`` tag (a
        search refused or broken after its run was opened: no run is left RUNNING)."""
        self.client.set_tag(run_id, FAILURE, _cut(reason, MAX_TAG_CHARS))
        self.client.set_terminated(run_id, "FAILED")

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        self.client.set_tag(run_id, key, value)

    def run_tags(self, run_id: str) -> dict[str, str]:
        """The tags of run ``run_id``; an unknown id is a ``UserError`` naming it and the store."""
        return dict(self._get_run(run_id).data.tags)

    def delete_child_runs(self, parent_id: str, tag: str, value: str) -> int:
        """Delete the child runs of ``parent_id`` tagged ``tag=value`` (half-written by a killed
        process); returns how many."""
        runs = self._find_runs(f"tags.`{tag}` = '{value}' and tags.`{PARENT}` = '{parent_id}'")
        for run in runs:
            self.client.delete_run(run.info.run_id)
        return len(runs)

    def log_curve(self, run_id: str, points: list[tuple[str, float, int, int]]) -> None:
        """Log ``(name, value, timestamp_ms, step)`` points in batches of MLflow's limit of 1000."""
        from mlflow.entities import Metric

        metrics = [Metric(k, float(v), t, step) for k, v, t, step in points]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(run_id, metrics=metrics[i:i + 1000])

    def log_artifacts(self, run_id: str, folder: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifacts(run_id, str(folder), artifact_path)

    def _log(
        self, run_id: str, *, params: dict[str, str] | None = None, metrics: dict[str, float] | None = None,
        step: int = 0,
    ) -> None:
        from mlflow.entities import Metric, Param

        now = int(time.time() * 1000)
        params_l = [Param(k, v) for k, v in (params or {}).items()]
        metrics_l = [Metric(k, v, now, step) for k, v in (metrics or {}).items()]
        for i in range(0, len(params_l), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(run_id, params=params_l[i:i + 100])
        if metrics_l:
            self.client.log_batch(run_id, metrics=metrics_l)



def data_name(source: str) -> str:
    """A short name of a data source for a run name: a file's or folder's name without its suffix.

    >>> data_name("/work/shared/data/adult.csv"), data_name("synthetic"), data_name("")
    ('adult', 'synthetic', '')
    """
    return Path(source.rstrip("/")).stem if source else ""


def _trial_status(run: Any) -> str:
    """The trial's status tag (``ok``, ``failed``, ``pruned``), else MLflow's status in lower case."""
    status = run.data.tags.get("rankitect.status")
    if status and run.info.status in ("FINISHED", "FAILED", "KILLED"):
        return status
    return str(run.info.status).lower()


def _is_winner(run: Any, winner: tuple[str | None, str | None] | None) -> bool:
    """Whether ``run`` is its search's winner: by name where the search recorded it (a baseline and
    a candidate may share a genotype), else by genotype hash."""
    if winner is None or run.data.tags.get(KIND) not in ("candidate", "baseline") or run.info.status != "FINISHED":
        return False
    name, h = winner
    if name is not None:
        return run.info.run_name == name
    return h is not None and run.data.tags.get("genotype_hash") == h


def _table_safe(df: pd.DataFrame) -> pd.DataFrame:
    """The table with JSON-friendly cells (numpy booleans and NaN become plain values)."""
    return df.astype(object).where(pd.notna(df), None)


def _view_state() -> str:
    """The shared runs-table view (MLflow's persisted UI state): metric columns, best test NE first,
    the runs grouped by their search (tag :data:`SEARCH`), every group expanded."""
    columns = [f"metrics.`{m}`" for m in VIEW_COLUMNS]
    # Grouped by search (its tag on every run of it), each group's row showing the best of its runs:
    # MLflow nests child runs under their parent only when ordered by start time, and collapsed.
    group = {"aggregateFunction": "min", "groupByKeys": [{"mode": "tag", "groupByData": SEARCH}]}
    return json.dumps({"searchFilter": "", "orderByKey": "metrics.`test/ne`", "orderByAsc": True,
                       "selectedColumns": ["attributes.`Source`", *columns], "runsHiddenMode": "SHOW_ALL",
                       "groupBy": group})
