"""A throwaway PostgreSQL server on 127.0.0.1 for the shared-search test, stopped by its pid.

Debian's server (package ``postgresql``, installed by ``make install``) refuses to run as root, so
as root the cluster belongs to the ``postgres`` user and its programs run through ``runuser``.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

START_TIMEOUT_S = 60


def server_bin() -> Path | None:
    """The folder of ``initdb`` and ``postgres``: on PATH, else Debian's versioned folder."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(versions[-1]).parent if versions else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepting(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def postgres_server() -> Iterator[str]:
    """Start a fresh cluster; yield its SQLAlchemy URL; stop the server by the pid it wrote."""
    bindir = server_bin()
    if bindir is None:
        raise RuntimeError("no PostgreSQL server (initdb) found: Debian's package `postgresql` "
                           "(installed by `make install`) is needed")
    root = os.geteuid() == 0
    as_user = ["runuser", "-u", "postgres", "--"] if root else []
    folder = Path(tempfile.mkdtemp(prefix="rankitect-pg-"))
    data = folder / "data"
    if root:
        shutil.chown(folder, "postgres", "postgres")
    server = None
    try:
        subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "rankitect",
                        "--no-sync", "-E", "UTF8"], check=True, capture_output=True, text=True)
        port = free_port()
        server = subprocess.Popen([*as_user, str(bindir / "postgres"), "-D", str(data), "-p", str(port),
                                   "-h", "127.0.0.1", "-k", str(folder), "-F"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + START_TIMEOUT_S
        while not _accepting(port):
            if server.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"postgres did not start on 127.0.0.1:{port}: {server.stderr.read()[-2000:]}")
            time.sleep(0.2)
        yield f"postgresql://rankitect@127.0.0.1:{port}/postgres"
    finally:
        if server is not None:
            pid_file = data / "postmaster.pid"
            if pid_file.is_file():  # the server itself (runuser is only its parent)
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGINT)  # fast shutdown
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        shutil.rmtree(folder, ignore_errors=True)
