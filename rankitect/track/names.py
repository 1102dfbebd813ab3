"""The names rankitect gives what it stores in MLflow: run tags, run kinds, metrics, artifacts.

One place for each name, so the code that writes a run (:mod:`rankitect.track.writer`), the code
that reads it back (:mod:`rankitect.track.reader`, ``rankitect runs``, resume, reconcile) and the
search that tags its own runs cannot drift apart. Plain strings only: importing this module costs
nothing and pulls in neither MLflow nor pandas.
"""

from __future__ import annotations

# --- tags on every kind of run -------------------------------------------------------------------
PARENT = "mlflow.parentRunId"  # MLflow's own: nests a child run under its search in the UI
KIND = "rankitect.kind"  # what the run is: one of the KIND_* values below
SEARCH = "rankitect.search"  # on a search run and all its runs: the search's name (the view groups by it)
GENOTYPE_HASH = "genotype_hash"  # a trial run's architecture (also one of its params)
ERROR = "error"  # why a trial failed
COMMAND = "rankitect.command"  # the command that made a run outside a search (train, finetune)

# --- tags on a search (parent) run ----------------------------------------------------------------
STRATEGY, SPACE, DATA = "rankitect.strategy", "rankitect.space", "rankitect.data"
WINNER = "rankitect.winner"  # its winner's name (a baseline's name or a genotype hash)
BEST_GENOTYPE_HASH = "best_genotype_hash"  # its winner's genotype hash
FAILURE = "rankitect.failure"  # why it ended FAILED (Tracker.fail_run)
CHECKPOINT = "rankitect.checkpoint"  # its checkpoint file, what --resume reads (one per joining process)

# --- tags on a trial run --------------------------------------------------------------------------
STATUS = "rankitect.status"  # the trial's own status: one of RUN_STATUS's keys
TRIAL = "rankitect.trial"  # the trial's number in its process's checkpoint ("stopped": cut by a signal)
TRIAL_ID = "rankitect.trial_id"  # unique across the processes of a shared search (reconcile uses it)
STOPPED = "rankitect.stopped"  # on a run cut short by the search's time budget (a trial, a supernet)
WORLD_SIZE = "rankitect.world_size"  # processes that trained it (rankitect train under torchrun)
FINETUNED_FROM = "rankitect.finetuned_from"  # a finetune run: the run whose model it started from
START = "rankitect.start"  # a finetune run: what its weights started from
KEPT = "rankitect.kept"  # a finetune run: which weights it kept ("start" or "finetuned")
BASELINE_KEY = "rankitect.baseline_key"  # a baseline run: its data, recipe and protocol (search.running.reuse)
REUSED_FROM = "rankitect.reused_from"  # a baseline run reused, not trained: the run it was trained in

# --- values of KIND -------------------------------------------------------------------------------
KIND_SEARCH, KIND_CANDIDATE, KIND_BASELINE, KIND_FINETUNE = "search", "candidate", "baseline", "finetune"
TRIAL_KINDS = (KIND_CANDIDATE, KIND_BASELINE)  # the runs a search's winner is chosen among

# A trial's status -> its MLflow run status. A pruned trial was stopped early by the search's
# successive halving: KILLED (ended before its natural end), with tag STATUS=pruned.
RUN_STATUS = {"ok": "FINISHED", "failed": "FAILED", "pruned": "KILLED"}

# --- metrics: one name each; a search run's are its winner's -------------------------------------
VAL_NE, TEST_NE, TEST_AUC, TEST_LOGLOSS = "val/ne", "test/ne", "test/auc", "test/logloss"
MFLOPS, PARAMS, TRAIN_SECONDS, OBJECTIVE = "mflops", "params", "train_seconds", "objective"
METRICS = {  # a trial run's metric name -> TrialResult attribute
    VAL_NE: "val_ne", TEST_NE: "test_ne", TEST_AUC: "test_auc", TEST_LOGLOSS: "test_logloss",
    MFLOPS: "mflops", PARAMS: "params", TRAIN_SECONDS: "train_seconds",
}
WINNER_METRICS = {  # a search run's metric name -> Pareto table column
    VAL_NE: "val_ne", TEST_NE: "test_ne", TEST_AUC: "test_auc", MFLOPS: "mflops", OBJECTIVE: "objective",
}
PARETO_IMAGE = "pareto"  # the key of a search run's NE-vs-FLOPs image among its charts
# The verdict (rankitect.search.judging.verdict): NE on the held-out validation rows, on the runs of
# the best baseline and the finalists; on the search run, how many rows and finalists, the winner's
# objective gain over the best baseline there and its paired standard error (NE units).
VERDICT_NE = "verdict/ne"
VERDICT_ROWS, VERDICT_FINALISTS, VERDICT_GAIN, VERDICT_SE = (
    "verdict/rows", "verdict/finalists", "verdict/gain", "verdict/se")

# --- artifacts ------------------------------------------------------------------------------------
GENOTYPE_FILE = "genotype.json"  # a trial run's architecture
CONFIG_FILE, SPACE_FILE = "config.yaml", "space.json"  # a search run's full config and space
BEST_GENOTYPE_FILE, STATE_FILE = "best_genotype.json", "search_state.json"
PARETO_TABLE, PARETO_CSV, PARETO_PNG = "pareto.json", "pareto.csv", "pareto.png"
BASELINE_DIR = "baseline"  # a baseline run's record for reuse: trial.json and its per-example losses
BASELINE_RECORD = "trial.json"
VERDICT_FILE = "verdict.json"  # a search run's final choice: rows, incumbent, finalists and their gains
MODEL_DIR, SPEC_FILE = "model", "feature_spec.json"  # a kept model: MODEL_DIR/{weights, SPEC_FILE}
# The logged pyfunc's name: not MODEL_DIR, since MLflow serves a run's artifact path from the run's
# logged model of that name first, and ``model/`` must stay the kept weights that export reads.
SCORER_MODEL = "scorer"

# --- the experiment -------------------------------------------------------------------------------
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")  # MLflow's model-training UI
VIEW_KEY = "rankitect"  # the experiment's shared runs-table view: tag mlflow.sharedViewState.<key>
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
VIEW_COLUMNS = (TEST_NE, VAL_NE, VERDICT_NE, TEST_AUC, MFLOPS, PARAMS, TRAIN_SECONDS)
