"""A thin layer over MLflow: a search is a parent run, every candidate a child run.

:class:`Tracker` is one experiment's writer (:mod:`rankitect.track.writer`: what a search and its
trials log) and reader (:mod:`rankitect.track.reader`: what ``rankitect runs``, export, finetune and
resume read back) in one object, as searches, workers and commands use it; the names it stores
runs under are :mod:`rankitect.track.names`'. MLflow is imported when a tracker is made.
"""

from __future__ import annotations

from rankitect.track.reader import ModelFiles, RunReader
from rankitect.track.writer import RunWriter, data_name

__all__ = ["ModelFiles", "Tracker", "data_name"]


class Tracker(RunWriter, RunReader):
    """Logs searches and their candidates to one MLflow experiment, and reads them back.

    Args:
        uri: tracking URI; default ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlruns/mlflow.db``.
        experiment: experiment name, created if new. With a SQLite store its artifacts go to
            ``artifacts/`` beside the database file (``mlruns/artifacts`` by default).
    """
