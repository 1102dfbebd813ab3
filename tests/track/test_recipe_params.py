"""A candidate's run carries its recipe genes as params, today's values spelled out."""

from __future__ import annotations

from mlflow import MlflowClient

from rankitect.eval.result import TrialResult
from rankitect.space.architecture import Architecture, BlockGene, HeadGene
from rankitect.space.recipe import Recipe
from rankitect.track import Tracker


def test_recipe_genes_are_run_params(tmp_path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = Tracker(uri, experiment="recipe")
    arch = Architecture((BlockGene("mlp", ("dense",), {"width": 4, "dropout": 0.2, "norm": "batchnorm"}),),
                        HeadGene(widths=(4,), dropout=0.1), 8,
                        recipe=Recipe(dim_large=4, embedding_l2=0.01, lr_dense=0.5))
    result = TrialResult(val_ne=0.7, test_ne=0.71, test_auc=0.7, test_logloss=0.4, mflops=1.0, params=10,
                         train_seconds=1.0)
    # a search logs its space's labels too; a width label of None (D) is logged as the width the model has
    run_id = tracker.log_trial(None, arch, result, params={"recipe.dim_small": None, "b0.width": 4})
    params = MlflowClient(uri).get_run(run_id).data.params
    assert {k: v for k, v in params.items() if k.startswith("recipe.")} == {
        "recipe.dim_small": "8", "recipe.dim_medium": "8", "recipe.dim_large": "4",
        "recipe.embedding_l2": "0.01", "recipe.lr_dense": "0.5", "recipe.lr_sparse": "1.0",
        "recipe.block_dropout": "0.2", "recipe.block_norm": "batchnorm",
        "recipe.head_dropout": "0.1", "recipe.head_norm": "none",
    }
    assert params["b0.width"] == "4"
