"""Where runs are stored, and the command that opens the MLflow UI on them (no MLflow import).

>>> resolve_uri("sqlite:////srv/runs/mlflow.db")
'sqlite:////srv/runs/mlflow.db'
>>> artifact_root("sqlite:////srv/runs/mlflow.db").as_posix()
'/srv/runs/artifacts'
>>> artifact_root("http://mlflow.internal:5000") is None
True
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DEFAULT_URI = "sqlite:///mlruns/mlflow.db"
SQLITE = "sqlite:///"


def resolve_uri(uri: str | None = None) -> str:
    """``uri``, else ``$MLFLOW_TRACKING_URI``, else :data:`DEFAULT_URI`.

    A relative SQLite path is made absolute against the working directory, so that worker
    processes and the UI server find the same database whatever their own directory.
    """
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    if uri.startswith(SQLITE) and not uri.startswith(SQLITE + "/") and ":memory:" not in uri:
        return SQLITE + Path(uri[len(SQLITE):]).resolve().as_posix()
    return uri


def artifact_root(uri: str) -> Path | None:
    """``artifacts/`` beside the database file of a SQLite ``uri``; ``None`` for other stores
    (a tracking server or a shared database decides itself where artifacts go)."""
    if not uri.startswith(SQLITE) or ":memory:" in uri:
        return None
    return Path(uri[len(SQLITE):]).parent / "artifacts"


def ui_command(uri: str | None = None, host: str = "127.0.0.1", port: int = 5000) -> list[str]:
    """The argv that serves the MLflow UI on the store ``uri`` (see :func:`resolve_uri`).

    >>> argv = ui_command("sqlite:////srv/runs/mlflow.db", port=8080)
    >>> argv[1:4], argv[argv.index("--port") + 1], argv[argv.index("--default-artifact-root") + 1]
    (['-m', 'mlflow', 'ui'], '8080', '/srv/runs/artifacts')
    """
    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")
    uri = resolve_uri(uri)
    argv = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port)]
    root = artifact_root(uri)
    if root is not None:
        argv += ["--default-artifact-root", root.as_posix()]
    return argv
