"""Faults a search must survive: kill -9 at random moments, processes started together on a fresh
shared storage, and bad inputs; prints what was lost (it must be nothing).

    python -m bench.faults.fault_bench                          # 5 kills, SQLite and PostgreSQL
    python -m bench.faults.fault_bench --kills 10 --processes 4 --storages sqlite
    python -m bench.faults.fault_bench --only-left-behind       # only the cases of 4.
    python -m bench.faults.fault_bench --only-baseline-kills    # only the cases of 5.

1. ``--kills`` times, a tiny ``evolution`` search (``--trials`` candidates, one baseline) is killed
   with SIGKILL at a random moment (seeded), then resumed; a last resume runs it to its end. Lost:
   a trial in the checkpoint without its child run (finished, failed or pruned), or a child run
   the checkpoint does not hold; repeated: one genotype trained twice.
2. ``--processes`` search processes released at once by a barrier on a fresh storage (SQLite, and
   PostgreSQL when Debian's server is installed): they must all exit 0 with one parent run, the
   trial budget trained exactly once, every trial's child run present.
3. Bad inputs, each run as a real ``rankitect`` process: exit status and the first error line.
4. Bad inputs that must be refused before any work, and a kill -9 of a search with two workers,
   each in a session of its own: exit status, and what it left behind (RUNNING runs, live
   processes, new files): must be nothing.
5. Kill -9 and SIGTERM during the k-th of three baselines (the first, the middle, the last; one
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

from bench.common import ROOT, parse_args

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

    from rankitect.search.running.checkpoint import load_state

    rng, parent, survived = random.Random(seed), None, 0
    argv = ["search", "--strategy", "evolution", "--trials", str(trials), "train.steps=20", "train.grace_steps=20",
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
    from rankitect.search.running.shared_study import load_shared_study
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--storages", default="sqlite,postgresql")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only-left-behind", action="store_true",
                    help="only the refusals and the kill of a pool (4.): what each left behind")
    ap.add_argument("--only-baseline-kills", action="store_true",
                    help="only the kills during the k-th baseline and SIGTERM under a time budget (5.)")
    args = parse_args(ap, {"kills": 1, "trials": 2, "processes": 2, "storages": "sqlite"}, argv)
    with tempfile.TemporaryDirectory(prefix="fault-bench-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "RANKITECT_DATA_DIR": str(work / "data"), "PYTHONUNBUFFERED": "1",
               "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlruns/mlflow.db", "PYTHONPATH": str(ROOT)}
        if args.only_left_behind:
            print_left_behind(env, work)
            return
        if args.only_baseline_kills:
            from rankitect.data import open_data

            open_data("synthetic", rows=3000, seed=0, cache_dir=work / "data")
            print_baseline_kills(env, work)
            return
        from rankitect.data import open_data

        open_data("synthetic", rows=3000, seed=0, cache_dir=work / "data")
        print("== kill -9 at random moments, then --resume ==")
        print(kills(env, work, args.kills, args.trials, args.seed))
        if not args.quick:
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
        print("\n== refusals and a kill of a pool of two: what each left behind ==")
        print_left_behind(env, work)


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

    from rankitect.search.running.checkpoint import load_state

    uri, rows = env["MLFLOW_TRACKING_URI"], []
    for signame, k, workers in cases:
        argv = ["search", "--strategy", "random", "--trials", "1", "train.max_epochs=2", "train.grace_steps=0",
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
            from rankitect.search.running.budget import parse_duration

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


# --- bad inputs that must exit 2 and leave nothing behind; a pool killed with its search ---------------------------------
# Each case runs as a real process in a session of its own; after it ends, what it left is counted:
# runs still RUNNING in the store, processes of its session still alive, new files outside the data
# cache (under the work folder). Run with --only-left-behind to run only these.

def _session_alive(sid: int) -> list[int]:
    """Running processes of session ``sid`` (a /proc scan; zombies count as ended)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
                found.append(int(entry.name))
    return found


def _running_runs(uri: str) -> int:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    try:
        exp = [e.experiment_id for e in client.search_experiments()]
        return len(client.search_runs(exp, "attributes.status = 'RUNNING'", max_results=1000)) if exp else 0
    except Exception:  # noqa: BLE001 - no store yet
        return 0


def _files(work: Path) -> set[str]:
    """Files under ``work`` but the data cache and the run store (which a case may rightly open)."""
    skip = ("data/", "mlruns/")
    return {str(p.relative_to(work)) for p in work.rglob("*") if p.is_file()
            and not str(p.relative_to(work)).startswith(skip)}


def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def _case(env: dict[str, str], work: Path, what: str, argv: list[str]) -> tuple[str, int, str, str]:
    """Run one case; ``(what, exit status, first error line, what it left behind)``."""
    uri, before, running = env["MLFLOW_TRACKING_URI"], _files(work), _running_runs(env["MLFLOW_TRACKING_URI"])
    proc = subprocess.Popen(rankitect(*argv), env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    _, err = proc.communicate(timeout=600)
    orphans = [] if _wait(lambda: not _session_alive(proc.pid), 30) else _session_alive(proc.pid)
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.startswith("rankitect:")]
    return (what, proc.returncode, lines[0] if lines else err.strip()[-200:],
            _left(_running_runs(uri) - running, orphans, sorted(_files(work) - before)))


def _left(running: int, orphans: list[int], files: list[str]) -> str:
    parts = [f"{running} RUNNING run(s)"] * bool(running) + [f"{len(orphans)} process(es)"] * bool(orphans)
    parts += [f"files {files[:3]}"] * bool(files)
    return ", ".join(parts) or "nothing"


def _bad_files(work: Path) -> None:
    """The bad files of these cases (CSV data sets with their schemas, a genotype)."""
    import numpy as np

    schema = "label: y\ndense: [a, b]\nsparse: [c]\n"
    rows = [f"{i % 2},{i},{i * 0.5},k{i % 7}" for i in range(400)]
    for name, edit in (("zeros", lambda r: ["0" + x[1:] for x in r]), ("ragged", lambda r: r[:9] + ["1,2"] + r[10:]),
                       ("infdense", lambda r: r[:9] + ["1,3,inf,k1"] + r[10:])):
        (work / f"{name}.csv").write_text("y,a,b,c\n" + "\n".join(edit(list(rows))) + "\n")
        (work / f"{name}.schema.yaml").write_text(schema)
    deep = {"blocks": [{"op": "mlp", "inputs": ["dense"], "params": {"width": 8, "num_layers": 1_000_000}}],
            "embedding_dim": 4}
    (work / "deep.json").write_text(json.dumps(deep))
    (work / "nested.json").write_text("[" * 100_000 + "]" * 100_000)
    good = work / "data" / "pickled"  # a data directory whose labels are a pickle that would run code
    (work / "good.csv").write_text("y,a,b,c\n" + "\n".join(rows) + "\n")
    (work / "good.schema.yaml").write_text(schema)
    from rankitect.data.tabular import read_tabular

    read_tabular(work / "good.csv", work / "good.schema.yaml", good)
    hostile = np.empty(2, dtype=object)
    hostile[:] = [_Unpickled(str(work / "data" / "code_ran"))] * 2
    np.save(good / "train" / "labels.npy", hostile, allow_pickle=True)


class _Unpickled:
    """Unpickling it creates a file: the proof that code ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (os.mkdir, (self.path,))


def left_behind_cases(env: dict[str, str], work: Path) -> list[tuple[str, int, str, str]]:
    """The bad inputs as real processes: exit status, first error line, what was left behind.

    The search-identity cases (resume with other data, duplicate baselines, flops_range [5, 1],
    baselines [nosuch]) check the search's own refusals; the rest the genotype pricing and the
    data checks."""
    _bad_files(work)
    tiny = ["data.rows=3000", "runtime.threads=1", "train.steps=1"]
    train = ["train", "--arch", "baseline:dlrm", *tiny]
    rows = [
        _case(env, work, "million-layer genotype", ["train", "--arch", "deep.json", *tiny]),
        _case(env, work, "JSON nested 100,000 deep", ["train", "--arch", "nested.json", *tiny]),
        _case(env, work, "all-zero labels", [*train, "data.source=zeros.csv"]),
        _case(env, work, "ragged row", [*train, "data.source=ragged.csv"]),
        _case(env, work, "inf dense", [*train, "data.source=infdense.csv"]),
        _case(env, work, "pickled npy in a data cache", [*train, f"data.source={work / 'data' / 'pickled'}"]),
        _case(env, work, "search.baselines=[nosuch]", ["search", "search.baselines=[nosuch]", *tiny]),
        _case(env, work, "search.baselines=[dlrm,dlrm]", ["search", "search.baselines=[dlrm,dlrm]", *tiny]),
        _case(env, work, "search.flops_range=[5,1]", ["search", "search.flops_range=[5,1]", *tiny]),
    ]
    if (work / "data" / "code_ran").exists():
        rows.append(("pickled npy: code ran", -1, "the pickle was loaded", "a directory made by its code"))
    rows.append(_resume_with_other_data(env, work, tiny))
    rows.append(_kill_pool_of_two(env, work, tiny))
    return rows


def _resume_with_other_data(env: dict[str, str], work: Path, tiny: list[str]) -> tuple[str, int, str, str]:
    """A one-trial search on 3000 rows, then its --resume with data.rows=3500."""
    argv = ["search", "--trials", "1", "search.baselines=[dlrm]", *tiny]
    done = subprocess.run(rankitect(*argv), env=env, cwd=work, capture_output=True, text=True, timeout=600)
    if "search run " not in done.stdout:
        return ("resume with other data", done.returncode, "the first search did not start", "")
    parent = done.stdout.split("search run ")[1].split(":")[0]
    return _case(env, work, "resume with other data", ["search", "--resume", parent, "data.rows=3500"])


def _kill_pool_of_two(env: dict[str, str], work: Path, tiny: list[str]) -> tuple[str, int, str, str]:
    """kill -9 of a search with --workers 2 once its pool runs: what of its session is left."""
    argv = ["search", "--workers", "2", "--trials", "4", "search.baselines=[dlrm]", *tiny[:-1], "train.steps=400"]
    proc = subprocess.Popen(rankitect(*argv), env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    # parent, resource tracker and two workers: the pool runs
    started = _wait(lambda: len(_session_alive(proc.pid)) >= 4, 300)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    gone = _wait(lambda: not _session_alive(proc.pid), 60)
    left = _session_alive(proc.pid)
    for pid in left:  # the bench leaves nothing running either way
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    note = "pool started" if started else "pool never reached 2 workers"
    return ("kill -9 with --workers 2", proc.returncode, note,
            "nothing" if gone else f"{len(left)} process(es) (killed by the bench)")


def print_left_behind(env: dict[str, str], work: Path) -> None:
    rows = left_behind_cases(env, work)
    width = max(len(r[0]) for r in rows)
    print(f"{'case':<{width}}  exit  left behind  |  first error line")
    for what, code, line, left in rows:
        print(f"{what:<{width}}  {code:>4}  {left}  |  {line[:140]}")
    print(f"exit 2: {sum(code == 2 for _, code, _, _ in rows)} of {len(rows)}; "
          f"nothing left: {sum(left == 'nothing' for *_, left in rows)} of {len(rows)}")


if __name__ == "__main__":
    main()
