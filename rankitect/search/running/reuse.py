"""Baselines paid once: a baseline trained on the same data, recipe, seed and protocol is reused.

Every baseline a search trains is tagged in the run store with its *key*
(:func:`baseline_key`): a digest of the data set as read (source kind, rows and clicks per split,
feature spec: :func:`~rankitect.search.running.identity.data_identity`), the baseline's genotype
(its recipe included), the whole training protocol (``train.*``: epochs, batch size, learning
rates, patience, seed, ...) and the validation rows the search holds out for its verdict. Beside
its kept weights it logs what a search needs of it besides (``baseline/trial.json``: its result and
validation curve; its per-example validation, test and held-out losses). A later search whose
baseline has the same key finds that run (:class:`BaselineStore`), records a baseline of its own
from it at once, with the weights and losses copied and the tag ``rankitect.reused_from`` naming
the run, and trains nothing. Another data slice, seed, recipe or protocol gives another key, and
``search.reuse_baselines=false`` retrains every baseline.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from rankitect.eval.result import TrialResult
from rankitect.search.running.trial import TrialOutput
from rankitect.space.architecture import Architecture

log = logging.getLogger(__name__)
RECORD_VERSION = 1  # part of every key: bump when what a baseline record holds or means changes
LOSSES = ("val", "test", "verdict")  # TrialOutput's per-example losses a record keeps


def baseline_key(arch: Architecture, data_identity: dict[str, Any], train: Any, verdict_fraction: float) -> str:
    """The key of a baseline's training: equal keys train the same model on the same rows.

    >>> from rankitect.config import TrainConfig
    >>> from rankitect.space.testing import tiny_spec
    >>> from rankitect.space.baselines import get_baseline
    >>> arch, data = get_baseline("dlrm", tiny_spec()), {"data.source": "synthetic", "data.rows": "x"}
    >>> baseline_key(arch, data, TrainConfig(), 0.5) == baseline_key(arch, data, TrainConfig(progress=False), 0.5)
    True
    >>> baseline_key(arch, data, TrainConfig(seed=1), 0.5) == baseline_key(arch, data, TrainConfig(), 0.5)
    False
    """
    protocol = {k: v for k, v in asdict(train).items() if k != "progress"}  # a bar changes no result
    blob = json.dumps({"version": RECORD_VERSION, "arch": arch.hash, "data": data_identity, "train": protocol,
                       "verdict": verdict_fraction}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


class BaselineStore:
    """Trained baselines in one experiment's run store, found by :func:`baseline_key`.

    Args:
        tracker: the search's :class:`~rankitect.track.Tracker`.
        folder: the search folder (downloads go to a scratch folder inside it and are removed).
        data_identity, train, verdict_fraction: what the keys of this search's baselines hold
            besides their genotypes (see :func:`baseline_key`).
    """

    def __init__(self, tracker: Any, folder: Path, *, data_identity: dict[str, Any], train: Any,
                 verdict_fraction: float) -> None:
        self.tracker, self.folder = tracker, Path(folder)
        self.data_identity, self.train, self.verdict_fraction = data_identity, train, verdict_fraction

    def key(self, arch: Architecture) -> str:
        """This search's key of baseline ``arch``."""
        return baseline_key(arch, self.data_identity, self.train, self.verdict_fraction)

    def find(self, arch: Architecture, weights_path: str) -> tuple[str, TrialOutput] | None:
        """The newest finished baseline run of ``arch``'s key with its record, and its output as this
        search's trial (its weights downloaded to ``weights_path``, where a trial leaves its own);
        ``None`` when there is none, or its record cannot be read (said in the log)."""
        run_id = self.tracker.find_baseline(self.key(arch))
        if run_id is None:
            return None
        scratch = self.folder / "reused"
        try:
            files = self.tracker.fetch_baseline(run_id, scratch)
            record = json.loads(files["record"].read_text())
            losses = {split: _load(files.get(split)) for split in LOSSES}
            Path(weights_path).parent.mkdir(parents=True, exist_ok=True)
            files["weights"].replace(weights_path)
        except Exception as e:  # noqa: BLE001 - a record that cannot be read: the baseline trains instead
            log.warning("baseline run %s not reused: %s: %s", run_id, type(e).__name__, e)
            return None
        finally:
            _remove(scratch)
        now = time.time()
        out = TrialOutput(TrialResult.from_dict(record["result"]), record["history"], val_losses=losses["val"],
                          test_losses=losses["test"], verdict_losses=losses["verdict"], probe_ne=record.get("probe_ne"),
                          started=now, ended=now)
        return run_id, out

    def keep(self, run_id: str, arch: Architecture, out: TrialOutput, reused_from: str | None = None) -> None:
        """Tag the run ``run_id`` of baseline ``arch`` with its key and log what a later search reuses
        of it (``reused_from``: the run it was itself reused from, tagged too)."""
        key = self.key(arch)
        record = {"version": RECORD_VERSION, "result": out.result.to_dict(), "history": out.history,
                  "probe_ne": out.probe_ne}
        losses = {split: getattr(out, f"{split}_losses") for split in LOSSES}
        try:
            self.tracker.keep_baseline(run_id, key, record, {k: v for k, v in losses.items() if v is not None},
                                       reused_from=reused_from)
        except Exception as e:  # noqa: BLE001 - the search goes on; a later one trains this baseline again
            log.warning("baseline run %s not kept for reuse: %s: %s", run_id, type(e).__name__, e)


def _load(path: Path | None) -> np.ndarray | None:
    if path is None or not path.is_file():
        return None
    losses = np.load(path, allow_pickle=False)
    if losses.ndim != 1:
        raise ValueError(f"{path.name}: expected one loss per row")
    return losses.astype(np.float32)


def _remove(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
