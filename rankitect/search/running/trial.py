"""Train and score one candidate, never raising for the candidate's own faults.

``run_trial`` is what every search evaluates, in-process or in a worker of a local process pool:
a candidate that fails to build, raises while training, or diverges becomes a failed
:class:`~rankitect.eval.result.TrialResult` with its error, and the search goes on.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import traceback
import multiprocessing as mp
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rankitect.config import TrainConfig
from rankitect.cost import measure
from rankitect.eval.result import TrialResult
from rankitect.search.judging.pruning import RungTicket
from rankitect.space.architecture import Architecture
from rankitect.space.pricing import check_fits

if TYPE_CHECKING:
    from rankitect.train.protocol import StepHook

log = logging.getLogger(__name__)


class StepFile:
    """A :data:`~rankitect.train.protocol.StepHook` for a worker process: the running trial's step
    and epoch written to a small JSON file at most every ``every`` seconds (and at the last step),
    which the search's progress display reads (:func:`read_steps`). Picklable."""

    def __init__(self, path: str, every: float = 1.0) -> None:
        self.path, self.every, self._last = path, every, -math.inf

    def __call__(self, step: int, total: int, epoch: int, epochs: int) -> None:
        now = time.monotonic()
        if now - self._last < self.every and step < total:
            return
        self._last = now
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump([step, total, epoch, epochs], f)
        os.replace(tmp, self.path)  # a reader sees the old note or the new one, never half of one

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "every": self.every}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["every"])


def read_steps(path: str | Path) -> tuple[int, int, int, int] | None:
    """What a :class:`StepFile` last wrote, ``(step, total, epoch, epochs)``; ``None`` before that."""
    try:
        step, total, epoch, epochs = json.loads(Path(path).read_text())
    except (OSError, ValueError, TypeError):
        return None
    return int(step), int(total), int(epoch), int(epochs)


@dataclass
class TrialOutput:
    """A trial's result plus what only the caller may want: the validation curve, the per-example
    validation losses of its best validation (an ok trial's; see :mod:`rankitect.search.judging.selection`)
    and a failure's traceback."""

    result: TrialResult
    history: list[dict[str, float]]
    traceback: str | None = None
    val_losses: np.ndarray | None = None
    test_losses: np.ndarray | None = None  # per-example, of an ok trial: what the quality bench reads
    verdict_losses: np.ndarray | None = None  # per-example on the held-out verdict rows (where carved)
    probe_ne: float | None = None  # its validation NE at the rung study's probe (reported as validation 0), if any
    started: float | None = None  # the trial's own wall clock (time.time()): its MLflow run's span
    ended: float | None = None


def candidates_per_request(data: Any) -> float:
    """Mean rows per request of the test split: the fan-out that ROCS serving shares work over."""
    test = data.split("test")
    return len(test) / max(1, test.n_requests)


def run_trial(
    arch: Architecture, data: Any, cfg: TrainConfig, weights_path: str | None = None, ticket: RungTicket | None = None,
    *, memory_budget: float | None = None, deadline: float | None = None, on_step: StepHook | None = None,
) -> TrialOutput:
    """:func:`_run_trial`, with the wall clock of its start and end (not of its wait in a queue)."""
    started = time.time()
    out = _run_trial(arch, data, cfg, weights_path, ticket, memory_budget=memory_budget, deadline=deadline,
                     on_step=on_step)
    return replace(out, started=started, ended=time.time())


def _run_trial(
    arch: Architecture, data: Any, cfg: TrainConfig, weights_path: str | None = None, ticket: RungTicket | None = None,
    *, memory_budget: float | None = None, deadline: float | None = None, on_step: StepHook | None = None,
) -> TrialOutput:
    """Price (against ``runtime.memory_budget``, ``memory_budget`` GB), cost
    (:func:`~rankitect.cost.measure`, once), train and score ``arch`` on ``data``; failures are
    returned, not raised: a candidate above the budget fails before anything of it is built. The
    result carries the :class:`~rankitect.cost.Cost`.

    With ``weights_path`` the trained model's ``state_dict`` is saved there as safetensors. With
    ``ticket`` every validation is reported to the search's rung study, which may stop the
    training: the trial is then ``pruned``, with its partial validation curve. Past ``deadline``
    (a ``time.time()`` instant: the search's time budget) the training ends with its best state
    so far, and the result's ``stopped`` says so. ``on_step`` sees every training step.
    """
    from rankitect.train.loop import train_architecture
    from rankitect.train.task import TrialPruned

    start = time.perf_counter()
    mflops = params = cost = None
    try:
        check_fits(arch, data.spec, memory_budget, cfg.batch_size)
        # A ROCS-masked candidate is served by score_requests, its request part once per request:
        # it is ranked by the MFLOPs per example at the data's candidates per request.
        cost = measure(arch, data.spec, candidates_per_request(data) if arch.rocs else None)
        mflops, params = cost.served_mflops, cost.params
        report = ticket.reporter() if ticket is not None else None
        out = train_architecture(arch, data, cfg, report=report, deadline=deadline, on_step=on_step)
        result = TrialResult.from_metrics(out.metrics, mflops=mflops, params=params, train_seconds=out.train_seconds,
                                          steps=out.steps, cost=cost, best_step=out.best_step, stopped=out.stopped,
                                          held_out_seconds=out.held_out_seconds)
        if weights_path is not None:
            from rankitect.track.weights import save_weights

            save_weights(out.model.state_dict(), weights_path)
        return TrialOutput(result=result, history=out.history, val_losses=out.val_losses, test_losses=out.test_losses,
                           verdict_losses=out.verdict_losses, probe_ne=out.probe_ne)
    except (KeyboardInterrupt, SystemExit):
        raise
    except TrialPruned as e:
        result = TrialResult.pruning(str(e), val_ne=e.best_ne, mflops=mflops, params=params,
                                     train_seconds=time.perf_counter() - start, steps=e.steps, cost=cost)
        return TrialOutput(result=result, history=e.history)
    except BaseException as e:  # noqa: BLE001 - a failed candidate never kills a search
        seconds = time.perf_counter() - start
        message = f"{type(e).__name__}: {e}"
        if deadline is not None and time.time() >= deadline:  # cut by the budget before it beat the base rate
            message = f"stopped by the time budget: {message}"
        log.warning("trial failed: %s", message)
        return TrialOutput(
            result=TrialResult.failure(message, mflops=mflops, params=params, train_seconds=seconds, cost=cost),
            history=[], traceback=traceback.format_exc(),
        )


# --- where trials run: in this process, or in a local process pool ------------------------------

ABORT_GRACE_S = 5.0  # seconds a terminated worker has to exit before it is killed
# Workers are forked by multiprocessing's fork server: one clean process, started once per search
# process, that imports torch and rankitect (WORKER_PRELOAD) and then forks every worker, so a
# worker starts in milliseconds instead of importing for seconds, and a search that rebuilds its
# pool (or a process that runs several searches) pays the imports once. The server never runs a
# torch operation, so no thread pool is forked (forking the search's own process could deadlock).
# ``__main__`` is imported there as spawn imports it: a script's own blocks are known to workers.
WORKER_START = "forkserver"
WORKER_PRELOAD = ["__main__", "rankitect.search.running.trial"]
_WORKER_DATA: dict[str, Any] = {}  # one opened data set per worker process (set by the initializer)


PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h): a signal this process gets when its parent ends


def die_with_parent(parent: int | None = None) -> None:
    """Have Linux SIGKILL this process when ``parent`` (the process that started it; by default its
    parent now) ends, however it ends (``kill -9`` included, where no cleanup of the parent's runs);
    exit at once when it has already ended. Elsewhere a no-op: the pool's own shutdown is all there is.

    Linux sends the signal when the *thread* that started the process ends: the pool's workers are
    forked by the single-threaded fork server (:data:`WORKER_START`)."""
    import ctypes
    import signal

    parent = os.getppid() if parent is None else parent
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # no libc prctl: not Linux
        return
    if os.getppid() != parent:  # the parent ended before the signal was asked for
        os._exit(1)


def die_with(pid: int) -> None:
    """End this process as soon as process ``pid`` ends, however it ends (``kill -9`` included); exit at
    once when it has already ended. A daemon thread waits on the process's pidfd (Linux 5.3; elsewhere
    it polls). A pool worker needs this beside :func:`die_with_parent`: its parent is the fork server,
    which ends only once every process holding its alive pipe (the workers too) has ended."""
    import select
    import threading

    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):  # no pidfd: poll
        handle = None

    def wait() -> None:
        if handle is not None:
            select.select([handle], [], [])
        else:
            while _alive(pid):
                time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=wait, name=f"rankitect-die-with-{pid}", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def user_modules() -> list[str]:
    """Modules outside rankitect that registered a block or a search space, and which another
    process can import: a worker imports them before its first trial, so a user's own block or
    space (a module the search's process imported) is known there too. (A script's ``__main__`` is
    imported again by every spawned worker, so what it registers is known there.)"""
    found = {getattr(item, "__module__", "") for item in _registered()}
    return sorted(m for m in found if m and m not in ("__main__", "__mp_main__") and m != "rankitect"
                  and not m.startswith("rankitect."))


def in_process_only() -> str | None:
    """Why this search's trials cannot run in spawned workers, or ``None``: its ``__main__`` names a
    file that does not exist (``python -`` reading stdin: a worker would fail to import it), or
    registered a block or space with no file at all (a notebook, ``python -c``: a worker would
    not know it)."""
    import sys

    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file is not None and not os.path.isfile(main_file):
        return f"the main program {main_file!r} is no file a worker process can import"
    if main_file is None and any(getattr(item, "__module__", "") == "__main__" for item in _registered()):
        return "blocks or spaces registered in __main__ (a notebook, python -c) are unknown to worker processes"
    return None


def _registered() -> list[Any]:
    from rankitect.blocks.base import BLOCKS
    from rankitect.space.space import SPACES

    return [*BLOCKS.values(), *SPACES.values()]


def _init_worker(data_path: str, threads: int, memory_budget: float | None = None, search: int | None = None,
                 modules: tuple[str, ...] = (), verdict: float = 0.0, environ: dict[str, str] | None = None,
                 cwd: str | None = None) -> None:
    import importlib
    import os

    import torch

    die_with_parent()  # the fork server
    if search is not None:
        die_with(search)  # and the search's process, however it ends
    if environ is not None:  # the search process's environment and folder now, not the server's at its start
        os.environ.clear()
        os.environ.update(environ)
    if cwd is not None:
        os.chdir(cwd)
    for module in modules:  # the user's own blocks and spaces, as the search's process knows them
        importlib.import_module(module)

    if os.environ.get("RANKITECT_QUIET"):  # set by the command line without -v
        from rankitect.verbosity import quiet_third_party

        quiet_third_party()

    from rankitect.data import ClickData

    if threads > 0:
        torch.set_num_threads(threads)
    _WORKER_DATA["data"] = ClickData.open(data_path).with_verdict(verdict)  # the rows the search's process holds out
    _WORKER_DATA["memory_budget"] = memory_budget


def _run_in_worker(arch_json: str, cfg: TrainConfig, weights_path: str | None, ticket: RungTicket | None,
                   deadline: float | None, on_step: StepHook | None) -> TrialOutput:
    return run_trial(Architecture.from_json(arch_json), _WORKER_DATA["data"], cfg, weights_path, ticket,
                     memory_budget=_WORKER_DATA["memory_budget"], deadline=deadline, on_step=on_step)


class InlineRunner:
    """Runs each trial at once in this process; ``submit`` returns an already finished future."""

    def __init__(self, data: Any, *, memory_budget: float | None = None) -> None:
        self.data, self.memory_budget = data, memory_budget

    def submit(
        self, arch: Architecture, cfg: TrainConfig, weights_path: str | None = None, ticket: RungTicket | None = None,
        *, deadline: float | None = None, on_step: StepHook | None = None,
    ) -> Future:
        future: Future = Future()
        future.set_result(run_trial(arch, self.data, cfg, weights_path, ticket, memory_budget=self.memory_budget,
                                    deadline=deadline, on_step=on_step))
        return future

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class TrialPool:
    """``workers`` processes, each with the data set opened once (memory-mapped, so shared).

    A worker that dies (killed, out of memory) fails only its own trial: the pool is rebuilt. The
    workers end with this process however it ends (:func:`die_with_parent`), and with them the
    last holders of multiprocessing's resource tracker pipe, so the tracker ends too.
    """

    def __init__(
        self, data_path: str, workers: int, threads_per_worker: int = 1, *, memory_budget: float | None = None,
        verdict: float = 0.0,
    ) -> None:
        self.data_path, self.workers, self.threads = data_path, workers, threads_per_worker
        self.memory_budget, self.verdict = memory_budget, verdict
        self.executor = self._new_executor()

    def _new_executor(self) -> ProcessPoolExecutor:
        ctx = mp.get_context(WORKER_START)
        ctx.set_forkserver_preload(WORKER_PRELOAD)
        return ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx, initializer=_init_worker,
                                   initargs=(self.data_path, self.threads, self.memory_budget, os.getpid(),
                                             tuple(user_modules()), self.verdict, dict(os.environ), os.getcwd()))

    def submit(
        self, arch: Architecture, cfg: TrainConfig, weights_path: str | None = None, ticket: RungTicket | None = None,
        *, deadline: float | None = None, on_step: StepHook | None = None,
    ) -> Future:
        """``on_step`` crosses to the worker: a picklable hook such as :class:`StepFile`."""
        args = (arch.to_json(), cfg, weights_path, ticket, deadline, on_step)
        try:
            return self.executor.submit(_run_in_worker, *args)
        except BrokenProcessPool:
            self.executor.shutdown(wait=False, cancel_futures=True)
            self.executor = self._new_executor()
            return self.executor.submit(_run_in_worker, *args)

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)

    def abort(self) -> None:
        """Stop now: queued trials are cancelled and running ones end with their workers.

        A signal may cut the pool's own bookkeeping (a worker started but not yet listed), and a
        SIGTERM sent while a worker is still being spawned can be lost: every child process is
        terminated, and killed if it is still there a few seconds later.
        """
        workers = set((self.executor._processes or {}).values()) | set(mp.active_children())  # no public handle
        self.executor.shutdown(wait=False, cancel_futures=True)
        for p in workers:
            p.terminate()
        for p in workers:
            p.join(ABORT_GRACE_S)
            if p.is_alive():
                p.kill()
                p.join()


def trial_output(future: Future) -> TrialOutput:
    """The output of a finished trial future; a crashed worker becomes a failed trial."""
    try:
        return future.result()
    except Exception as e:  # noqa: BLE001 - e.g. the worker process died
        return TrialOutput(TrialResult.failure(f"worker failed: {type(e).__name__}: {e}"), [], None)
