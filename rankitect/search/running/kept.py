"""The trained weights a search keeps: on their way from a trial to the MLflow artifact store.

A trial writes its weights (safetensors) into the search folder's ``weights/``; once the trial
is recorded they either go to its child run as ``model/`` (every baseline, the ``keep_top_k``
best candidates and the winner so far: :meth:`~rankitect.search.judging.standings.Standings.kept`) or are
deleted, and a candidate that falls out of the kept set has them taken off its run again. So the artifact store holds the only copy, and the search folder keeps only its
checkpoint and tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rankitect.search.running.checkpoint import TrialRecord


class KeptWeights:
    """Weights of the trials of one process of a search, in ``folder / "weights"``."""

    def __init__(self, tracker: Any, folder: Path, spec: Any) -> None:
        self.tracker, self.folder, self.spec = tracker, folder, spec

    def path(self, name: str) -> str:
        """Where the trial ``name`` leaves its trained weights until :meth:`sync` moves or drops them."""
        return str(self.folder / "weights" / f"{name}.safetensors")

    def sync(self, mine: list[TrialRecord], kept: set[str], dropped: set[str]) -> None:
        """Move the weights of the ``kept`` trials among ``mine`` to their runs, delete the others'
        and take them off the runs of ``dropped`` (kept before, no longer). Only ``mine`` are
        touched: processes of a shared search share the folder."""
        by_name = {t.name: t for t in mine}
        for name, t in by_name.items():
            path = Path(self.path(name))
            if not path.is_file():
                continue
            if name in kept and t.run_id:
                self.tracker.log_model_files(t.run_id, path, self.spec_file())
            if t.run_id or name not in kept:  # a kept trial not logged yet keeps its file for a resume
                path.unlink()
        for name in dropped:
            if name in by_name and by_name[name].run_id:
                self.tracker.delete_model_files(by_name[name].run_id)

    def spec_file(self) -> Path:
        """The data's feature spec beside the checkpoint (it goes with every kept model)."""
        path = self.folder / "feature_spec.json"
        if not path.is_file():
            self.spec.save(path)
        return path
