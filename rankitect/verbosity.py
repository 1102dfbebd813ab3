"""What the command line (and its worker processes) print besides results: quiet unless ``-v``.

MLflow logs INFO lines on every store it opens (and alembic on every migration), Lightning and
torch warn about things a search user cannot change (torch.fx's ``is_fx_tracing`` on every torchrec
model built). Without ``-v`` those loggers show errors only, and warnings raised outside rankitect
are ignored; ``rankitect``'s own warnings still show.
Child processes (a worker pool, the UI server) inherit the setting through the environment.
"""

from __future__ import annotations

import logging
import os
import warnings

QUIET_LOGGERS = ("mlflow", "alembic", "optuna", "pytorch_lightning", "lightning", "lightning.pytorch",
                 "lightning_fabric", "torch", "torch.fx", "torch.fx._symbolic_trace", "torchrec", "urllib3",
                 "matplotlib", "fbgemm_gpu")
QUIET_ENV = "RANKITECT_QUIET"


def set_verbosity(verbose: bool) -> None:
    """Quiet (the default) or ``-v``: see the module docstring."""
    if verbose:
        os.environ.pop(QUIET_ENV, None)
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        return
    os.environ[QUIET_ENV] = "1"
    # MLflow configures its own logger when imported; this is the level it reads then.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    quiet_third_party()


def quiet_third_party() -> None:
    """Keep third-party loggers at ERROR and drop warnings raised outside rankitect."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    warnings.filterwarnings("default", module="rankitect")
