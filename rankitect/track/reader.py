"""What is read back from the runs a search logged: ``rankitect runs``, export, finetune, resume.

The tables of searches and of one search's trials, a run's tags and settings, and the files a run
kept of its trained model. The layout read here is the one :mod:`rankitect.track.writer` writes;
the names are :mod:`rankitect.track.names`'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from rankitect.track.experiment import Experiment
from rankitect.track.names import (BASELINE_DIR, BASELINE_KEY, BASELINE_RECORD, BEST_GENOTYPE_HASH, DATA, ERROR,
                                   GENOTYPE_FILE, GENOTYPE_HASH, KIND, KIND_SEARCH, METRICS, MFLOPS, MODEL_DIR, PARENT, SPACE, SPEC_FILE, STATUS,
                                   STRATEGY, TEST_NE, TRIAL_KINDS, WINNER)
from rankitect.track.weights import LEGACY_WEIGHTS_FILE, WEIGHTS_FILE


@dataclass(frozen=True)
class ModelFiles:
    """Local copies of what a run keeps of a trained model."""

    run_id: str
    genotype: Path
    weights: Path
    spec: Path


class RunReader(Experiment):
    """Reads the searches and trials of one MLflow experiment back (see :class:`Experiment`)."""

    def runs_table(self, parent_id: str | None = None) -> pd.DataFrame:
        """Candidate and baseline runs of one search (or of the whole experiment), best test NE first.

        ``status`` is the trial's own (``ok``, ``failed``, ``pruned``: stopped early by the search),
        or MLflow's where a run has none (``running``, ``killed``); ``winner`` marks the search's winner."""
        if parent_id is not None and not parent_id.isalnum():
            from rankitect.errors import UserError

            raise UserError(f"{parent_id!r} is not an MLflow run id (letters and digits; a setting is key=value)")
        query = f"tags.`{PARENT}` = '{parent_id}'" if parent_id else f"tags.`{KIND}` != '{KIND_SEARCH}'"
        winners = self._winners(parent_id)
        rows = []
        for run in self._find_runs(query):
            m, t = run.data.metrics, run.data.tags
            rows.append({
                "run_id": run.info.run_id, "parent_id": t.get(PARENT), "kind": t.get(KIND),
                "name": run.info.run_name, GENOTYPE_HASH: t.get(GENOTYPE_HASH),
                "status": _trial_status(run), "winner": _is_winner(run, winners.get(t.get(PARENT))),
                **{k: m.get(k, math.nan) for k in METRICS}, "error": t.get(ERROR),
            })
        columns = ["run_id", "parent_id", "kind", "name", GENOTYPE_HASH, "status", "winner", *METRICS, "error"]
        df = pd.DataFrame(rows, columns=columns)
        return df.sort_values(TEST_NE, kind="stable", na_position="last").reset_index(drop=True)

    def _winners(self, parent_id: str | None) -> dict[str, tuple[str | None, str | None]]:
        """Search run id -> (winner's name, winner's genotype hash) of one search or of all."""
        runs = [self._get_run(parent_id)] if parent_id else self._find_runs(f"tags.`{KIND}` = '{KIND_SEARCH}'")
        return {r.info.run_id: (r.data.tags.get(WINNER), r.data.tags.get(BEST_GENOTYPE_HASH)) for r in runs}

    def searches_table(self) -> pd.DataFrame:
        """The searches (parent runs) of the experiment, newest first, with their data and winner."""
        rows = [{
            "run_id": r.info.run_id, "name": r.info.run_name, "strategy": r.data.tags.get(STRATEGY),
            "space": r.data.tags.get(SPACE), "data": r.data.tags.get(DATA) or r.data.params.get("data.source"),
            "status": r.info.status, "start_time": pd.to_datetime(r.info.start_time, unit="ms").floor("s"),
            "winner": r.data.tags.get(WINNER) or r.data.tags.get(BEST_GENOTYPE_HASH),
            TEST_NE: r.data.metrics.get(TEST_NE, math.nan),
            MFLOPS: r.data.metrics.get(MFLOPS, math.nan),
        } for r in self._find_runs(f"tags.`{KIND}` = '{KIND_SEARCH}'")]
        df = pd.DataFrame(rows, columns=["run_id", "name", "strategy", "space", "data", "status", "start_time",
                                         "winner", TEST_NE, MFLOPS])
        return df.sort_values("start_time", ascending=False, kind="stable").reset_index(drop=True)

    def fetch_model_files(self, run_id: str, dst: str | Path) -> ModelFiles:
        """Download a run's genotype, weights and feature spec into ``dst``.

        A search (parent) run stands for its winner. Raises ``UserError`` naming the run when
        something is missing.
        """
        from rankitect.errors import UserError

        run = self._get_run(run_id)
        if run.data.tags.get(KIND) == KIND_SEARCH:
            run = self._winner_of(run)
        rid = run.info.run_id
        dst = Path(dst)
        try:
            genotype = self.client.download_artifacts(rid, GENOTYPE_FILE, str(dst))
            folder = self.client.download_artifacts(rid, MODEL_DIR, str(dst))
        except Exception as e:  # noqa: BLE001 - MLflow raises its own exception types
            raise UserError(f"run {rid}: no trained weights were kept for it (only the top candidates "
                            f"and the baselines keep theirs): {type(e).__name__}") from None
        weights = Path(folder) / WEIGHTS_FILE
        if not weights.is_file():
            weights = Path(folder) / LEGACY_WEIGHTS_FILE
        return ModelFiles(rid, Path(genotype), weights, Path(folder) / SPEC_FILE)

    def find_baseline(self, key: str) -> str | None:
        """The newest finished baseline run tagged with reuse ``key`` that kept its record
        (:mod:`rankitect.search.running.reuse`); ``None`` when there is none."""
        runs = self._find_runs(f"tags.`{BASELINE_KEY}` = '{key}' and attributes.status = 'FINISHED'")
        for run in sorted(runs, key=lambda r: r.info.start_time or 0, reverse=True):
            paths = {f.path for f in self.client.list_artifacts(run.info.run_id, BASELINE_DIR)}
            if f"{BASELINE_DIR}/{BASELINE_RECORD}" in paths:
                return run.info.run_id
        return None

    def fetch_baseline(self, run_id: str, dst: str | Path) -> dict[str, Path]:
        """Download a reusable baseline run's record, losses and weights into ``dst``: ``record``,
        ``weights`` and, where it kept them, ``val``, ``test``, ``verdict`` (per-example losses)."""
        dst = Path(dst)
        folder = Path(self.client.download_artifacts(run_id, BASELINE_DIR, str(dst)))
        model = Path(self.client.download_artifacts(run_id, MODEL_DIR, str(dst)))
        files = {"record": folder / BASELINE_RECORD, "weights": model / WEIGHTS_FILE}
        for split in ("val", "test", "verdict"):
            if (folder / f"{split}_losses.npy").is_file():
                files[split] = folder / f"{split}_losses.npy"
        return files

    def get_run(self, run_id: str) -> Any:
        """The MLflow run ``run_id``; an unknown id is a ``UserError`` naming it and the store."""
        return self._get_run(run_id)

    def run_tags(self, run_id: str) -> dict[str, str]:
        """The tags of run ``run_id``; an unknown id is a ``UserError`` naming it and the store."""
        return dict(self._get_run(run_id).data.tags)

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
        search_id = run_id if run.data.tags.get(KIND) == KIND_SEARCH else run.data.tags.get(PARENT)
        if not search_id:
            return None
        found = self._find_runs(f"tags.`{PARENT}` = '{search_id}' and tags.`{KIND}` = '{kind}'")
        if not found:
            return None
        return Path(self.client.download_artifacts(found[0].info.run_id, artifact_path, str(dst)))

    def _winner_of(self, search_run: Any) -> Any:
        from rankitect.errors import UserError

        h = search_run.data.tags.get(BEST_GENOTYPE_HASH)
        query = f"tags.`{PARENT}` = '{search_run.info.run_id}' and tags.{GENOTYPE_HASH} = '{h}'"
        found = [r for r in self._find_runs(query)
                 if r.data.tags.get(KIND) in TRIAL_KINDS and r.info.status == "FINISHED"] if h else []
        if not found:
            raise UserError(f"search run {search_run.info.run_id} has no winner (not finished, or every trial failed)")
        return found[0]


def _trial_status(run: Any) -> str:
    """The trial's status tag (``ok``, ``failed``, ``pruned``), else MLflow's status in lower case."""
    status = run.data.tags.get(STATUS)
    if status and run.info.status in ("FINISHED", "FAILED", "KILLED"):
        return status
    return str(run.info.status).lower()


def _is_winner(run: Any, winner: tuple[str | None, str | None] | None) -> bool:
    """Whether ``run`` is its search's winner: by name where the search recorded it (a baseline and
    a candidate may share a genotype), else by genotype hash."""
    if winner is None or run.data.tags.get(KIND) not in TRIAL_KINDS or run.info.status != "FINISHED":
        return False
    name, h = winner
    if name is not None:
        return run.info.run_name == name
    return h is not None and run.data.tags.get(GENOTYPE_HASH) == h
