"""The trial pool's workers, and multiprocessing's resource tracker, end with the process that
started them, even when it is killed with SIGKILL and runs no cleanup at all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.paths import ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")

# A search's process in small: a pool of two workers (each opened the data set) busy with trials
# that would run for minutes; it says who its workers and its resource tracker are, then waits.
POOL_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    from multiprocessing import resource_tracker
    import numpy as np
    from rankitect.data.spec import DenseFeature, FeatureSpec, SparseFeature
    from rankitect.data.store import StoreWriter
    from rankitect.search.running.trial import TrialPool

    out = sys.argv[1]
    spec = FeatureSpec(dense=(DenseFeature("d0"),), sparse=(SparseFeature("s0", 5),), name="t")
    with StoreWriter(out, spec, {"train": 2, "val": 2, "test": 2}) as w:
        for i, split in enumerate(("train", "val", "test")):
            w.write(split, np.ones((2, 1)), np.ones((2, 1), dtype=np.int64), np.array([0.0, 1.0]),
                    np.array([2 * i, 2 * i + 1]))
        w.close({"source": "test"})
    pool = TrialPool(out, 2)
    workers = set()
    while len(workers) < 2:  # both workers initialized (a task runs only after the initializer)
        workers |= {f.result() for f in [pool.executor.submit(os.getpid) for _ in range(4)]}
    futures = [pool.executor.submit(time.sleep, 600) for _ in range(2)]
    workers = [p.pid for p in pool.executor._processes.values()]
    print(json.dumps({"workers": workers, "tracker": resource_tracker._resource_tracker._pid}), flush=True)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _in_session(sid: int) -> list[int]:
    """Running processes of session ``sid`` (a /proc scan: field 6 of /proc/PID/stat)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def _wait_until(condition, seconds: float) -> bool:
    """Poll ``condition`` until it holds or ``seconds`` pass (a bounded retry on the real state)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.mark.slow
def test_no_orphan_is_left_after_kill_9_of_a_pool_of_two(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-c", POOL_SCRIPT, str(tmp_path / "data")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = parent.stdout.readline()
        assert line, parent.stderr.read()
        pids = json.loads(line)
        workers, tracker = pids["workers"], pids["tracker"]
        assert len(workers) == 2 and all(_alive(p) for p in workers)
        assert tracker is not None and _alive(tracker)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        assert _wait_until(lambda: not any(_alive(p) for p in [*workers, tracker]), 60), (
            f"left running: {[p for p in [*workers, tracker] if _alive(p)]}")
        assert _wait_until(lambda: not _in_session(parent.pid), 30), f"left in the session: {_in_session(parent.pid)}"
    finally:
        for pid in _in_session(parent.pid):  # a failed run leaves nothing behind either
            os.kill(pid, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
