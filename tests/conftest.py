"""Test-wide settings."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Test files that hold a ``slow`` test run first, each file's tests together and in their order
    (module fixtures are built once): the long end-to-end tests start while the other pytest-xdist
    worker is free, and the run ends on quick ones, so both workers end at about the same time."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Tiny models on a shared 2-core machine run far faster (and steadier) on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", autouse=True)
def _mlflow_tables_once(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every test opens a fresh SQLite MLflow store, whose tables MLflow builds by running all of its
    schema migrations (about a CPU-second each time). Here MLflow migrates one store per test process
    and a fresh store's tables are a copy of it (SQLite's backup): the same schema, built by MLflow.
    Stores on other databases, and stores in the tests' subprocesses, are built as MLflow builds them."""
    from mlflow.store.db import utils

    migrate = utils._initialize_tables
    template = tmp_path_factory.getbasetemp() / "mlflow-tables.db"

    def initialize(engine) -> None:  # noqa: ANN001 - a SQLAlchemy engine
        if engine.url.get_backend_name() != "sqlite" or engine.url.database in (None, "", ":memory:"):
            migrate(engine)
            return
        if not template.exists():
            import sqlalchemy

            built = sqlalchemy.create_engine(f"sqlite:///{template}")
            try:
                migrate(built)
            finally:
                built.dispose()
        with closing(sqlite3.connect(template)) as src, closing(sqlite3.connect(Path(engine.url.database))) as dst:
            src.backup(dst)

    utils._initialize_tables = initialize
    yield
    utils._initialize_tables = migrate
