"""rankitect.track: MLflow tracking of searches (parent runs) and candidates (child runs).

``Tracker`` imports MLflow when it is created; ``ui_command`` and ``resolve_uri`` do not.
"""

from rankitect.config_rules import flatten
from rankitect.track.mlflow_tracker import Tracker
from rankitect.track.location import DEFAULT_URI, artifact_root, resolve_uri, ui_command

__all__ = ["DEFAULT_URI", "Tracker", "artifact_root", "flatten", "resolve_uri", "ui_command"]
