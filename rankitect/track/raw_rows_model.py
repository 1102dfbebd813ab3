"""The MLflow pyfunc of an exported model: raw feature columns in, click probabilities out.

MLflow logs this file as the model's code ("models from code"), beside the export directory as
the artifact ``export``; loading it needs MLflow and torch, not rankitect: the export's
``model.py`` holds the network, its weights reader and the feature preprocessing.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel


class RawRowsModel(PythonModel):
    """``predict(DataFrame of raw columns) -> list of click probabilities``."""

    def load_context(self, context: Any) -> None:
        directory = context.artifacts["export"]
        spec = importlib.util.spec_from_file_location("rankitect_exported_model", f"{directory}/model.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        self.scorer = module.load_scorer(directory)

    # A DataFrame hint: MLflow then validates no schema (raw columns of any dtype) and does not warn.
    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> list[float]:
        """Every feature column must be there and no unknown one (a ``ValueError`` names it);
        ``params={"allow_missing": True}`` scores absent columns as missing values."""
        rows = model_input.to_dict(orient="records") if hasattr(model_input, "to_dict") else list(model_input)
        return self.scorer(rows, allow_missing=bool((params or {}).get("allow_missing", False))).tolist()


mlflow.models.set_model(RawRowsModel())
