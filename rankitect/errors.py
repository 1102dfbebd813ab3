"""Errors that reach a user as one clear message (no traceback) from the CLI."""

from __future__ import annotations


class UserError(Exception):
    """A problem with what the user handed in (a file, a line, a key, a value).

    The CLI prints ``error: <message>`` and exits with status 2. The message must name the
    file and line, or the key and value, at fault.
    """


class DataError(UserError, ValueError):
    """Bad input data: names the file and, where there is one, the line.

    >>> str(DataError("wrong number of columns: 3, expected 40", path="x.tsv", line=7))
    'x.tsv:7: wrong number of columns: 3, expected 40'
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        self.path, self.line, self.reason = path, line, message
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message)


class ConfigError(UserError, ValueError):
    """A bad configuration key or value (unknown key, wrong type); names the key."""
