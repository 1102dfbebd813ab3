"""What a search and its trials log to MLflow: a search is a parent run, every candidate a child run.

Parent run (named by strategy, space, data and start time; tags ``rankitect.kind=search``,
``rankitect.strategy``, ``rankitect.space``, ``rankitect.data``, and ``rankitect.search``, its name,
which every run of the search carries too: the shared view groups the runs list by it): the
flattened config as params (long values cut, the full config in ``config.yaml``), ``space.json``,
and at the end ``pareto.csv``, ``pareto.png`` (also an MLflow image, key ``pareto``, among the
run's charts), the Pareto table as an MLflow table (``pareto.json``), ``best_genotype.json``,
``search_state.json``, the winner's metrics under the candidates' names and its name as tag
``rankitect.winner``.

Child run (tag ``mlflow.parentRunId``; ``rankitect.kind`` is ``candidate``, ``baseline`` or
``finetune``): params ``genotype_hash``, the recipe genes (``recipe.*``) and every architecture
choice under the space's flat label (``b0.flat``, ``b0.width``, ...), metrics ``val/ne`` (also at every validation step), ``test/ne``,
``test/auc``, ``test/logloss``, ``mflops``, ``params``, ``train_seconds``, artifact
``genotype.json``; its real start and end times; tag ``rankitect.status`` (``ok``, ``failed``,
``pruned``); status FINISHED, FAILED with the message in the ``error`` tag, or KILLED for a trial
the search's successive halving stopped early. One name per metric: a search run's ``test/ne`` is
its winner's. Every name is :mod:`rankitect.track.names`'.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from rankitect.config_rules import flatten
from rankitect.track.experiment import Experiment
from rankitect.track.names import (BASELINE_DIR, BASELINE_KEY, BASELINE_RECORD, BEST_GENOTYPE_FILE, BEST_GENOTYPE_HASH,
                                   CONFIG_FILE, DATA, ERROR, FAILURE,
                                   GENOTYPE_FILE, GENOTYPE_HASH, KIND, KIND_BASELINE, KIND_CANDIDATE, KIND_SEARCH,
                                   METRICS, MODEL_DIR, PARENT, PARETO_CSV, PARETO_IMAGE, PARETO_PNG, PARETO_TABLE,
                                   REUSED_FROM, RUN_STATUS, SCORER_MODEL, SEARCH, SPACE, SPACE_FILE, SPEC_FILE, STATE_FILE,
                                   STATUS, STRATEGY, VAL_NE as METRIC_VAL_NE, VERDICT_FILE, VERDICT_FINALISTS, VERDICT_GAIN, VERDICT_NE,
                                   VERDICT_ROWS, VERDICT_SE, WINNER, WINNER_METRICS)
from rankitect.track.weights import WEIGHTS_FILE, save_weights

MAX_PARAM_CHARS = 500  # MLflow allows 6000, but the UI's params table is unreadable long before
MAX_TAG_CHARS = 8000  # MLflow's limit on a tag value
MAX_BATCH_METRICS, MAX_BATCH_PARAMS = 1000, 100  # MLflow's limits on one log_batch


class RunWriter(Experiment):
    """Logs searches and their candidates to one MLflow experiment (see :class:`Experiment`)."""

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
        tags = {KIND: KIND_SEARCH, STRATEGY: strategy_name, SPACE: space_name, SEARCH: name or default}
        if source:
            tags[DATA] = _cut(source, MAX_TAG_CHARS)
        run = self.client.create_run(self.experiment_id, run_name=name or default, tags=tags,
                                     start_time=int(started * 1000))
        run_id = run.info.run_id
        self._log(run_id, params={k: _cut(str(v), MAX_PARAM_CHARS) for k, v in flatten(config).items()})
        self.client.log_text(run_id, yaml.safe_dump(config, sort_keys=False), CONFIG_FILE)
        if not isinstance(space, str) and hasattr(space, "to_dict"):
            self.client.log_dict(run_id, space.to_dict(), SPACE_FILE)
        return run_id

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
        (default: by the result's status, see :data:`~rankitect.track.names.RUN_STATUS`) may be
        KILLED: a trial its search was stopped in.
        """
        h = _hash_of(arch)
        tags = {KIND: KIND_BASELINE if baseline else KIND_CANDIDATE, GENOTYPE_HASH: h}
        if parent_id is not None:
            tags[PARENT], tags[SEARCH] = parent_id, self._search_of(parent_id)
        tags[STATUS] = result.status
        if result.error:
            tags[ERROR] = _cut(str(result.error), MAX_TAG_CHARS)
        tags.update({k: str(v) for k, v in (extra_tags or {}).items()})
        end = end_time if end_time is not None else time.time()
        start = start_time if start_time is not None else end - float(result.train_seconds or 0.0)
        run = self.client.create_run(self.experiment_id, run_name=baseline or h, tags=tags,
                                     start_time=int(start * 1000))
        run_id = run.info.run_id
        metrics = {k: float(getattr(result, a)) for k, a in METRICS.items() if getattr(result, a) is not None}
        # The recipe genes as the model has them (a width choice of None is D) over the space's labels.
        every = {GENOTYPE_HASH: h, **{k: _cut(str(v), MAX_PARAM_CHARS) for k, v in (params or {}).items()},
                 **_recipe_params(arch)}
        self._log_history(run_id, history or [], start, end)
        last = max((int(p["step"]) for p in history or []), default=0)
        self._log(run_id, params=every, metrics=metrics, step=last)
        self.client.log_text(run_id, _genotype_text(arch), GENOTYPE_FILE)
        self.client.set_terminated(run_id, status or RUN_STATUS[result.status], end_time=int(end * 1000))
        return run_id

    def _log_history(self, run_id: str, history: list[dict[str, float]], start: float, end: float) -> None:
        """Validation curves under the metrics' own names, stamped between the run's start and end."""
        last = max((p["step"] for p in history), default=1) or 1
        stamp = lambda step: int((start + (end - start) * min(step / last, 1.0)) * 1000) - 1  # noqa: E731
        self.log_curve(run_id, [(k, v, stamp(p["step"]), int(p["step"])) for p in history
                                for k, v in p.items() if k != "step"])

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
        now = int(time.time() * 1000)
        self.log_curve(run_id, [(name, v, now, i) for i, v in enumerate(values)])

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path)

    def log_artifacts(self, run_id: str, folder: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifacts(run_id, str(folder), artifact_path)

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
            self.client.log_table(parent_id, data=_table_safe(pareto_df), artifact_file=PARETO_TABLE)
        with tempfile.TemporaryDirectory() as tmp:
            pareto_df.to_csv(Path(tmp) / PARETO_CSV, index=False)
            self.client.log_artifact(parent_id, str(Path(tmp) / PARETO_CSV))
            if len(pareto_df):
                png = plot_pareto(pareto_df, Path(tmp) / PARETO_PNG, title=plot_title, floor=floor)
                self.client.log_artifact(parent_id, str(png))
                self._log_chart(parent_id, png)
        self.client.log_dict(parent_id, state, STATE_FILE)
        if best_arch is not None:
            self.client.log_text(parent_id, _genotype_text(best_arch), BEST_GENOTYPE_FILE)
            self.client.set_tag(parent_id, BEST_GENOTYPE_HASH, _hash_of(best_arch))
        winner = pareto_df[pareto_df["winner"]] if "winner" in pareto_df else pareto_df.iloc[:0]
        if len(winner):
            row = winner.iloc[0]
            metrics = {k: float(row[c]) for k, c in WINNER_METRICS.items() if c in row and pd.notna(row[c])}
            self._log(parent_id, metrics=metrics)
            self.client.set_tag(parent_id, WINNER, str(row["name"]))
        self.client.set_terminated(parent_id, status)

    def keep_baseline(self, run_id: str, key: str, record: dict[str, Any], losses: Mapping[str, Any], *,
                      reused_from: str | None = None) -> None:
        """Tag a baseline run with its reuse ``key`` and log its ``record`` (result and curve) and
        per-example ``losses`` (split -> float32 array) under ``baseline/`` (see
        :mod:`rankitect.search.running.reuse`); ``reused_from``: the run it was reused from."""
        import numpy as np

        self.client.set_tag(run_id, BASELINE_KEY, key)
        if reused_from is not None:
            self.client.set_tag(run_id, REUSED_FROM, reused_from)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / BASELINE_RECORD).write_text(json.dumps(record))
            for split, values in losses.items():
                np.save(Path(tmp) / f"{split}_losses.npy", np.asarray(values, dtype=np.float32), allow_pickle=False)
            self.client.log_artifacts(run_id, tmp, BASELINE_DIR)

    def log_verdict(self, parent_id: str, verdict: dict[str, Any], run_ids: dict[str, str]) -> None:
        """The search's verdict (:meth:`~rankitect.search.judging.verdict.Verdict.to_dict`): ``verdict.json``
        on the search run with its rows, finalists and winner's gain there; ``verdict/ne`` on the
        runs of the best baseline and the finalists (``run_ids``: trial name -> run id)."""
        self.client.log_dict(parent_id, verdict, VERDICT_FILE)
        if not verdict.get("rows"):
            return
        won = next((f for f in verdict["finalists"] if f["name"] == verdict["winner"]), None)
        metrics = {VERDICT_ROWS: float(verdict["rows"]), VERDICT_FINALISTS: float(len(verdict["finalists"]))}
        if won is not None:
            metrics.update({VERDICT_GAIN: won["gain"], VERDICT_SE: won["se"]})
        self._log(parent_id, metrics=metrics)
        held = [(verdict["incumbent"], verdict["incumbent_ne"])] + [(f["name"], f["ne"]) for f in verdict["finalists"]]
        for name, ne in held:
            if name in run_ids and ne is not None:  # at the run's last step and end, as its final metrics are
                info = self.client.get_run(run_ids[name]).info
                steps = [m.step for m in self.client.get_metric_history(run_ids[name], METRIC_VAL_NE)]
                self._log(run_ids[name], metrics={VERDICT_NE: float(ne)}, timestamp=info.end_time,
                          step=max(steps, default=0))

    def _log_chart(self, run_id: str, png: Path) -> None:
        """The NE-vs-FLOPs plot as an MLflow image of the run (key ``pareto``): shown among the
        run's charts, beside the ``pareto.png`` artifact."""
        import numpy as np
        from matplotlib.image import imread

        image = (np.clip(imread(png)[..., :3], 0.0, 1.0) * 255).round().astype(np.uint8)  # (H, W, 3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # MLflow's notes on image formats
            self.client.log_image(run_id, image, key=PARETO_IMAGE, step=0)

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

    def delete_child_runs(self, parent_id: str, tag: str, value: str) -> int:
        """Delete the child runs of ``parent_id`` tagged ``tag=value`` (half-written by a killed
        process); returns how many."""
        runs = self._find_runs(f"tags.`{tag}` = '{value}' and tags.`{PARENT}` = '{parent_id}'")
        for run in runs:
            self.client.delete_run(run.info.run_id)
        return len(runs)

    def log_curve(self, run_id: str, points: Iterable[tuple[str, float, int, int]]) -> None:
        """Log ``(name, value, timestamp_ms, step)`` points in batches of MLflow's limit."""
        from mlflow.entities import Metric

        metrics = [Metric(k, float(v), t, step) for k, v, t, step in points]
        for i in range(0, len(metrics), MAX_BATCH_METRICS):
            self.client.log_batch(run_id, metrics=metrics[i:i + MAX_BATCH_METRICS])

    def _log(
        self, run_id: str, *, params: dict[str, str] | None = None, metrics: dict[str, float] | None = None,
        step: int = 0, timestamp: int | None = None,
    ) -> None:
        from mlflow.entities import Metric, Param

        now = int(time.time() * 1000) if timestamp is None else timestamp
        params_l = [Param(k, v) for k, v in (params or {}).items()]
        metrics_l = [Metric(k, v, now, step) for k, v in (metrics or {}).items()]
        for i in range(0, len(params_l), MAX_BATCH_PARAMS):
            self.client.log_batch(run_id, params=params_l[i:i + MAX_BATCH_PARAMS])
        if metrics_l:
            self.client.log_batch(run_id, metrics=metrics_l)


def data_name(source: str) -> str:
    """A short name of a data source for a run name: a file's or folder's name without its suffix.

    >>> data_name("/work/shared/data/adult.csv"), data_name("synthetic"), data_name("")
    ('adult', 'synthetic', '')
    """
    return Path(source.rstrip("/")).stem if source else ""


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


def _table_safe(df: pd.DataFrame) -> pd.DataFrame:
    """The table with JSON-friendly cells (numpy booleans and NaN become plain values)."""
    return df.astype(object).where(pd.notna(df), None)
