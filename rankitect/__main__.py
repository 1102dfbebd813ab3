"""``python -m rankitect`` is the ``rankitect`` command (also under ``torchrun``)."""

from rankitect.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
