"""Fixtures of the search tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mlflow import MlflowClient


@pytest.fixture()
def env(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A fresh MLflow store in ``tmp_path`` (also the working directory) and one data cache shared by
    the session's search tests; returns the environment for subprocesses."""
    data_dir = tmp_path_factory.getbasetemp() / "search-data"
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    monkeypatch.setenv("RANKITECT_DATA_DIR", str(data_dir))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    # the store's tables built here (a copy: tests/conftest.py), not by the test's first subprocess
    (tmp_path / "mlruns").mkdir()
    MlflowClient(uri).search_experiments()
    return {**os.environ, "RANKITECT_DATA_DIR": str(data_dir), "MLFLOW_TRACKING_URI": uri, "PYTHONUNBUFFERED": "1"}
