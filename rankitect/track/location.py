"""Where runs are stored, and the command that opens the MLflow UI on them (no MLflow import).

>>> resolve_uri("sqlite:////srv/runs/mlflow.db")
'sqlite:////srv/runs/mlflow.db'
>>> artifact_root("sqlite:////srv/runs/mlflow.db").as_posix()
'/srv/runs/artifacts'
>>> artifact_root("http://mlflow.internal:5000") is None
True
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_URI = "sqlite:///mlruns/mlflow.db"
SQLITE = "sqlite:///"
STOP_GRACE_S = 10.0  # after SIGTERM, how long the UI's processes get before SIGKILL


def resolve_uri(uri: str | None = None) -> str:
    """``uri``, else ``$MLFLOW_TRACKING_URI``, else :data:`DEFAULT_URI`.

    A relative SQLite path is made absolute against the working directory, so that worker
    processes and the UI server find the same database whatever their own directory.
    """
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    if uri.startswith(SQLITE) and not uri.startswith(SQLITE + "/") and ":memory:" not in uri:
        return SQLITE + Path(uri[len(SQLITE):]).resolve().as_posix()
    return uri


def artifact_root(uri: str) -> Path | None:
    """``artifacts/`` beside the database file of a SQLite ``uri``; ``None`` for other stores
    (a tracking server or a shared database decides itself where artifacts go)."""
    if not uri.startswith(SQLITE) or ":memory:" in uri:
        return None
    return Path(uri[len(SQLITE):]).parent / "artifacts"


def ui_command(uri: str | None = None, host: str = "127.0.0.1", port: int = 5000) -> list[str]:
    """The argv that serves the MLflow UI on the store ``uri`` (see :func:`resolve_uri`).

    >>> argv = ui_command("sqlite:////srv/runs/mlflow.db", port=8080)
    >>> argv[1:4], argv[argv.index("--port") + 1], argv[argv.index("--default-artifact-root") + 1]
    (['-m', 'mlflow', 'ui'], '8080', '/srv/runs/artifacts')
    """
    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")
    uri = resolve_uri(uri)
    argv = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port)]
    root = artifact_root(uri)
    if root is not None:
        argv += ["--default-artifact-root", root.as_posix()]
    return argv


def store_args(uri: str) -> str:
    """`` track.uri=URI`` for a hint printed after a command, or ``""`` when ``uri`` is the default
    store of the working directory (what a command without the override opens).

    >>> store_args(resolve_uri(DEFAULT_URI))
    ''
    >>> store_args("sqlite:////srv/runs/mlflow.db")
    ' track.uri=sqlite:////srv/runs/mlflow.db'
    """
    return "" if uri == resolve_uri(DEFAULT_URI) else f" track.uri={uri}"


def store_exists(uri: str) -> bool:
    """Whether a SQLite store's database file exists (other stores: assumed to)."""
    if not uri.startswith(SQLITE) or ":memory:" in uri:
        return True
    return Path(uri[len(SQLITE):]).is_file()


# The leader of the UI server's process group (see ui_guard.py), run as a script: it imports no
# rankitect (nor torch), so it starts at once.
GUARD = Path(__file__).with_name("ui_guard.py")


def serve_ui(argv: list[str], env: dict[str, str]) -> int:
    """Run the UI server ``argv`` in a process group of its own until it exits or this process gets
    SIGTERM or SIGINT; then the whole group is stopped (SIGTERM, SIGKILL after a grace period), so no
    worker outlives the command. The group's leader (:data:`GUARD`) watches a pipe from this process
    and stops the group when this process ends in any other way (``kill -9``). Returns the server's
    exit status, 0 when stopped by a signal."""
    guard_env = {**env, "RANKITECT_UI_GRACE": str(STOP_GRACE_S)}
    proc = subprocess.Popen([sys.executable, str(GUARD), *argv], env=guard_env, stdin=subprocess.PIPE,
                            start_new_session=True)
    stopped: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        stopped.append(signum)
        _signal_group(proc.pid, signal.SIGTERM)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        stop_group(proc)
        proc.stdin.close()
    return 0 if stopped else code


def check_port(host: str, port: int) -> None:
    """Raise ``UserError`` naming ``host:port`` when a server already listens there (the UI would
    otherwise fail to bind, and a browser would show the other server), or the host is unknown."""
    import errno
    import socket

    from rankitect.errors import UserError

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise UserError(f"--host {host}: not a host name or address of this machine ({e.strerror})") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is free
        try:
            probe.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UserError(f"port {port} on {host} is already in use (another server?): "
                                f"choose another with --port") from None
            raise UserError(f"cannot serve on {host}:{port}: {e.strerror}") from None


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group led by ``proc``, wait for it to empty, SIGKILL what is left."""
    _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and _group_alive(proc):
        time.sleep(0.1)  # polling a process group: there is nothing to wait on for non-children
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def _group_alive(proc: subprocess.Popen) -> bool:
    proc.poll()  # reap the leader, else it stays a zombie member of the group
    try:
        os.killpg(proc.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
