"""Start several ``rankitect`` processes at the same instant: each imports everything first, says
it is ready, and waits on its stdin; when every one is ready, all are released at once (a barrier,
no sleeping)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

READY = "rankitect-ready"
# Import what a search imports before it touches a storage, so the released processes race on
# the storage itself, not on their imports.
_LAUNCH = (
    "import sys\n"
    "import mlflow, optuna, pytorch_lightning, torch\n"
    "from rankitect.cli import main\n"
    "import rankitect.search.running.runner\n"
    f"print({READY!r}, flush=True)\n"
    "sys.stdin.readline()\n"
    "raise SystemExit(main(sys.argv[1:]))\n"
)


def start_together(argvs: list[list[str]], env: dict[str, str], cwd: Path) -> list[subprocess.Popen]:
    """One ``rankitect ARGV`` process per entry, all released together; returns them running."""
    procs = [subprocess.Popen([sys.executable, "-c", _LAUNCH, *argv], env=env, cwd=cwd, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for argv in argvs]
    for p in procs:
        line = p.stdout.readline()
        if line.strip() != READY:
            for q in procs:
                q.kill()
            raise RuntimeError(f"a process did not get ready: {line!r} {p.stderr.read()[-2000:]}")
    for p in procs:  # the barrier opens (``communicate`` closes each stdin later)
        p.stdin.write("go\n")
        p.stdin.flush()
    return procs
