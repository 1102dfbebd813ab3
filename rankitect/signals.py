"""Stopping a search by SIGTERM or SIGINT: a clean stop with an honest exit status.

While :func:`stop_on_signals` is active, either signal raises :class:`Stopped` in the main thread
(a ``SystemExit`` whose code is 128 + the signal number, so a scheduler sees that the search did
not finish). Lightning's own SIGTERM handler runs first and ours after it. Code that must not be
cut in half (writing a finished trial to the checkpoint and to MLflow) runs inside
:meth:`StopGuard.deferred`: a signal arriving there is raised when the block ends.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(SystemExit):
    """A search stopped by ``signum``; exits the process with status ``128 + signum``.

    >>> Stopped(signal.SIGTERM).code, Stopped(signal.SIGTERM).name
    (143, 'SIGTERM')
    """

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class StopGuard:
    """Turns a signal into :class:`Stopped`, at once or at the end of a :meth:`deferred` block."""

    def __init__(self) -> None:
        self.pending: int | None = None
        self._depth = 0

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self._depth:
            self.pending = signum
            return
        raise Stopped(signum)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """A block that a signal does not cut: it is raised as :class:`Stopped` when the block ends."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if not self._depth and self.pending is not None:
            signum, self.pending = self.pending, None
            raise Stopped(signum)


@contextmanager
def stop_on_signals() -> Iterator[StopGuard]:
    """Handle SIGTERM and SIGINT with a :class:`StopGuard` for the block (main thread only; in any
    other thread the guard is returned without handlers, as Python allows them only there)."""
    guard = StopGuard()
    if threading.current_thread() is not threading.main_thread():
        yield guard
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, guard.handle)
    try:
        yield guard
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
