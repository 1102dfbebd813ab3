"""Faults a search must survive: kill -9 at random moments, processes started together on a fresh
shared storage, and bad inputs; prints what was lost (it must be nothing).

    .venv/bin/python bench/fault_bench.py                          # 5 kills, SQLite and PostgreSQL
    .venv/bin/python bench/fault_bench.py --kills 10 --processes 4 --storages sqlite

1. ``--kills`` times, a tiny ``evolution`` search (``--trials`` candidates, one baseline) is killed
   with SIGKILL at a random moment (seeded), then resumed; a last resume runs it to its end. Lost:
   a trial in the checkpoint without its child run (finished, failed or pruned), or a child run
   the checkpoint does not hold; repeated: one genotype trained twice.
2. ``--processes`` search processes released at once by a barrier on a fresh storage (SQLite, and
   PostgreSQL when Debian's server is installed): they must all exit 0 with one parent run, the
   trial budget trained exactly once, every trial's child run present.
3. Bad inputs, each run as a real ``rankitect`` process: exit status and the first error line.
4. Kill -9 and SIGTERM during the k-th of three baselines (the first, the middle, the last; one
   worker and two), and SIGTERM under a time budget, each resumed to its end
   (:func:`print_baseline_kills`): a table of kills survived in each phase, trials lost, baselines
   trained twice, and whether the resumed budget kept the time spent before.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TINY = ["data.rows=3000", "train.batch_size=64", "train.val_every=5", "train.val_batches=2", "train.test_batches=2",
        "runtime.threads=1", "search.evolution.population=2", "search.evolution.sample_size=2"]


def rankitect(*argv: str) -> list[str]:
    return [sys.executable, "-m", "rankitect", *argv]


def children(uri: str, parent: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = [e.experiment_id for e in client.search_experiments()]
    return list(client.search_runs(exp, f"tags.`mlflow.parentRunId` = '{parent}'", max_results=1000))


def kills(env: dict[str, str], work: Path, n: int, trials: int, seed: int) -> dict[str, int]:
    """Kill -9 a search ``n`` times at random moments, resume it each time, run it to its end."""
    from mlflow import MlflowClient

    from rankitect.search.checkpoint import load_state

    rng, parent, survived = random.Random(seed), None, 0
    argv = ["search", "--strategy", "evolution", "--trials", str(trials), "train.steps=20", "train.warmup_steps=20",
            "search.baselines=[dlrm]", *TINY]
    for _ in range(n + 1):
        cmd = rankitect(*argv) if parent is None else rankitect("search", "--resume", parent)
        proc = subprocess.Popen(cmd, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = proc.stdout.readline()
        parent = parent or line.split("search run ")[1].split(":")[0]
        if survived < n:
            time.sleep(rng.uniform(0.0, 8.0))  # a random moment of the search's life (a bench, not a test)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                survived += 1
        proc.communicate()
        if survived == n and proc.returncode == 0:
            break
    state = load_state(Path(MlflowClient(env["MLFLOW_TRACKING_URI"]).get_run(parent).data.tags["rankitect.checkpoint"]))
    # every child run but those a stop signal leaves (a kill -9 leaves none): finished, failed, pruned
    runs = {r.info.run_id: r for r in children(env["MLFLOW_TRACKING_URI"], parent)
            if r.data.tags.get("rankitect.trial") != "stopped"}
    recorded = {t.run_id for t in state.trials}
    names = [t.name for t in state.trials]
    return {"kills survived": survived, "finished": int(state.done), "trials": len(state.candidates()),
            "lost": len(recorded - set(runs)) + len(set(runs) - recorded), "repeated": len(names) - len(set(names))}


def together(env: dict[str, str], work: Path, storage: str, processes: int, trials: int) -> dict[str, object]:
    """``processes`` searches released at once on the fresh ``storage``."""
    from rankitect.search._optuna import counts
    from rankitect.search.shared import load_shared_study
    from tests.search.together import start_together

    argv = ["search", "--strategy", "random", "--trials", str(trials), "--storage", storage, "--study-name", "s",
            "train.steps=1", "search.baselines=[]", *TINY]
    procs = start_together([argv] * processes, env, work)
    outs = [p.communicate() for p in procs]
    ok = [p.returncode == 0 for p in procs]
    parents = {o.split("search run ")[1].split(":")[0] for o, _ in outs if "search run " in o}
    hashes = [t.user_attrs["genotype_hash"] for t in load_shared_study(storage, "s").get_trials() if counts(t)]
    logged = [r.data.tags["genotype_hash"] for p in parents for r in children(env["MLFLOW_TRACKING_URI"], p)]
    return {"started together": processes, "exit 0": sum(ok), "parent runs": len(parents),
            "trained": len(hashes), "budget": trials, "lost": len(set(hashes) - set(logged)),
            "repeated": len(logged) - len(set(logged)),
            "first error": next((e.strip().splitlines()[-1] for p, (_, e) in zip(procs, outs) if p.returncode), "")}


def bad_inputs(env: dict[str, str], work: Path) -> list[tuple[str, int, str]]:
    """Each bad input as a real process: (what, exit status, first error line)."""
    import numpy as np
    import pandas as pd

    pd.DataFrame({"y": np.arange(40) % 2, "a": np.arange(40) % 5, "rid": ["r0"] * 40}).to_csv(work / "one.csv",
                                                                                             index=False)
    (work / "s.yaml").write_text("label: y\nsparse: [a]\nrequest_id: rid\n")
    hostile = {"blocks": [{"op": "mlp", "inputs": ["dense"], "params": {"activation": "__import__('os')", "width": 8}}],
               "embedding_dim": 4}
    (work / "hostile.json").write_text(json.dumps(hostile))
    (work / "a_file").write_text("x\n")
    cases = [
        ("train.steps=0", ["search", "train.steps=0"]), ("search.trials=-1", ["search", "search.trials=-1"]),
        ("search.workers=0", ["search", "search.workers=0"]), ("train.batch_size=0", ["search", "train.batch_size=0"]),
        ("train.lr_dense=-1", ["search", "train.lr_dense=-1"]), ("data.rows=0", ["search", "data.rows=0"]),
        ("data.rows=-5", ["search", "data.rows=-5"]),
        ("search.evolution.population=0", ["search", "search.evolution.population=0"]),
        ("train.lr_dense=.nan", ["train", "--arch", "baseline:dlrm", "train.lr_dense=.nan"]),
        ("--space nasrek", ["search", "--space", "nasrek"]), ("--strategy evolutoin", ["search", "--strategy", "evolutoin"]),
        ("one-request CSV: search", ["search", "data.source=one.csv", "data.schema=s.yaml"]),
        ("one-request CSV: train", ["train", "--arch", "baseline:dlrm", "data.source=one.csv", "data.schema=s.yaml"]),
        ("one-request CSV: data inspect", ["data", "inspect", "one.csv", "data.schema=s.yaml"]),
        ("hostile activation", ["train", "--arch", "hostile.json", "data.rows=300"]),
        ("--resume of no run", ["search", "--resume", "nosuchrun"]),
    ]
    rows = []
    for what, argv in cases:
        proc = subprocess.run(rankitect(*argv), env=env, cwd=work, capture_output=True, text=True, timeout=600)
        lines = [ln for ln in proc.stderr.replace("\r", "\n").splitlines() if ln.startswith("rankitect:")]
        rows.append((what, proc.returncode, lines[0] if lines else proc.stderr.strip()[-200:]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--storages", default="sqlite,postgresql")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fault-bench-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "RANKITECT_DATA_DIR": str(work / "data"), "PYTHONUNBUFFERED": "1",
               "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlruns/mlflow.db", "PYTHONPATH": str(ROOT)}
        from rankitect.data import open_data

        open_data("synthetic", rows=3000, seed=0, cache_dir=work / "data")
        print("== kill -9 at random moments, then --resume ==")
        print(kills(env, work, args.kills, args.trials, args.seed))
        print_baseline_kills(env, work)
        print(f"\n== {args.processes} processes released together on a fresh storage ==")
        for backend in args.storages.split(","):
            with contextlib.ExitStack() as stack:
                if backend == "sqlite":
                    storage = f"sqlite:///{work}/study.db"
                else:  # a throwaway server on 127.0.0.1, stopped by its pid
                    from tests.search.pg_server import postgres_server

                    storage = stack.enter_context(postgres_server())
                print(backend, together(env, work, storage, args.processes, 4))
        print("\n== bad inputs ==")
        rows = bad_inputs(env, work)
        width = max(len(r[0]) for r in rows)
        for what, code, line in rows:
            print(f"{what:<{width}}  exit {code}  {line[:150]}")
        print(f"refused with exit 2: {sum(code == 2 for _, code, _ in rows)} of {len(rows)}")


# --- kills in the baseline phase, and SIGTERM under a time budget ---------------------------------

BASELINES = ["dlrm", "deepfm", "dcnv2"]
BASELINE_CASES = [("SIGKILL", 1, 1), ("SIGKILL", 2, 1), ("SIGKILL", 3, 1), ("SIGKILL", 2, 2),
                  ("SIGTERM", 1, 1), ("SIGTERM", 2, 2), ("SIGTERM", 3, 1)]


def _kill_at(proc: subprocess.Popen, k: int, signame: str) -> None:
    """Signal the search once the k-th baseline runs: after the estimate line (k = 1) or the k - 1-th
    baseline's line (each printed after the event it reports), kill -9 with its workers."""
    seen = 0
    for line in proc.stdout:
        seen += line.startswith("[baseline]")
        if (k == 1 and line.startswith("estimate:")) or (k > 1 and seen >= k - 1):
            break
    if signame == "SIGKILL":
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        proc.send_signal(signal.SIGTERM)
    proc.communicate()


def _baseline_account(uri: str, parent: str, before: Any, after: Any) -> dict[str, object]:
    """Lost: a baseline recorded before the kill that is gone or changed, a trial without its child
    run or a finished child run the checkpoint lacks; trained twice: a baseline with two finished runs."""
    runs = {r.info.run_id: r for r in children(uri, parent) if r.info.status != "KILLED"}
    kept = {t.trial_id: t for t in after.trials}
    lost = sum(t.trial_id not in kept or kept[t.trial_id].result != t.result for t in before.trials)
    lost += len({t.run_id for t in after.trials} ^ set(runs))
    names = [r.info.run_name for r in runs.values() if r.data.tags.get("rankitect.kind") == "baseline"]
    return {"baselines": len(set(names)), "lost": lost, "trained twice": len(names) - len(set(names)),
            "elapsed kept": after.elapsed >= before.elapsed}


def baseline_kills(env: dict[str, str], work: Path, cases: list[tuple[str, int, int]] = BASELINE_CASES,
                   budget: str | None = None) -> list[dict[str, object]]:
    """Each case ``(signal, k, workers)``: a search of three baselines signalled during its k-th
    baseline, then resumed to its end; with ``budget`` (``search.time_budget``) the resumed search
    must also end within it, counting the time spent before the signal."""
    from mlflow import MlflowClient

    from rankitect.search.checkpoint import load_state

    uri, rows = env["MLFLOW_TRACKING_URI"], []
    for signame, k, workers in cases:
        argv = ["search", "--strategy", "random", "--trials", "1", "train.max_epochs=2", "train.warmup_steps=0",
                f"search.baselines=[{','.join(BASELINES)}]", f"search.workers={workers}", "search.pruning=none", *TINY]
        argv += [f"search.time_budget={budget}"] if budget else []
        proc = subprocess.Popen(rankitect(*argv), env=env, cwd=work, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        parent = proc.stdout.readline().split("search run ")[1].split(":")[0]
        _kill_at(proc, k, signame)
        path = Path(MlflowClient(uri).get_run(parent).data.tags["rankitect.checkpoint"])
        before = load_state(path)
        done = subprocess.run(rankitect("search", "--resume", parent), env=env, cwd=work, capture_output=True,
                              text=True)
        after = load_state(path)
        row = {"phase": "baselines" + (f", budget {budget}" if budget else ""), "signal": signame, "k": k,
               "workers": workers, "survived": int(done.returncode == 0 and after.done)}
        row |= _baseline_account(uri, parent, before, after)
        if budget:
            from rankitect.search.budget import parse_duration

            row["within budget"] = after.elapsed <= parse_duration(budget) + 60  # plus a validation and the end
        rows.append(row)
    return rows


def print_baseline_kills(env: dict[str, str], work: Path) -> None:
    """The table of :func:`baseline_kills`: kills survived in the baseline phase and under a time
    budget, nothing lost or trained twice."""
    rows = baseline_kills(env, work) + baseline_kills(env, work, [("SIGTERM", 2, 1)], budget="40s")
    print("\n== kill -9 and SIGTERM during the k-th baseline, SIGTERM under a time budget, then --resume ==")
    cols = list(dict.fromkeys(c for r in rows for c in r))
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r.get(c, "")) for c in cols))
    print(f"survived {sum(r['survived'] for r in rows)} of {len(rows)}; lost {sum(r['lost'] for r in rows)}, "
          f"trained twice {sum(r['trained twice'] for r in rows)}")


if __name__ == "__main__":
    main()
