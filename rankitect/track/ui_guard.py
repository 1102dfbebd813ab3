"""The leader of the UI server's process group: ``python ui_guard.py SERVER_ARGV...``.

It starts the server and stops the whole group (the server and its workers) when

* its stdin reaches end of file: the command holding the pipe's other end has ended, however it
  ended (``kill -9`` included: the kernel closes a dead process's files), or
* it gets SIGTERM or SIGINT, or the server exits.

Stopping is SIGTERM to the group, a grace period (``RANKITECT_UI_GRACE`` seconds) for the server,
then SIGKILL to the group (this process last) unless the server had ended by itself, whose status
is then this process's. Standard library only, run as a script: nothing of rankitect is imported.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading


def main(argv: list[str]) -> int:
    server = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    done = threading.Event()

    def watch_parent() -> None:
        sys.stdin.buffer.read()  # returns at end of file only
        done.set()

    def watch_server() -> None:
        server.wait()
        done.set()

    for target in (watch_parent, watch_server):
        threading.Thread(target=target, daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(1.0):  # a timed wait: a set() from a signal handler is seen however it lands
        pass
    code = server.poll()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)
    try:
        server.wait(timeout=float(os.environ.get("RANKITECT_UI_GRACE", "10")))
    except subprocess.TimeoutExpired:
        pass
    if code is None:  # stopped from outside: whatever of the group outlived SIGTERM goes now
        os.killpg(0, signal.SIGKILL)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
