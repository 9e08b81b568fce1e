"""The family of errors a user can fix (a config value, a data file, a model directory).

``toolgrpo`` prints them as one line and exits 2; any other exception is a bug and keeps its
traceback. Subclasses stay ``ValueError`` so library callers that caught that still do.
"""

from __future__ import annotations


class UserError(ValueError):
    """Input the user got wrong; the message alone says what and where."""


class DataError(UserError):
    """A dataset that cannot be used as asked (missing, empty, malformed with bad_rows=error).
    Lives here, not in the loader, so every data source can raise it without importing it."""


def one_line(e: BaseException) -> str:
    """An exception's message on one line (multi-line messages joined with ' | ')."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return " | ".join(lines) or type(e).__name__


def shown(text: object, limit: int = 80) -> str:
    """User-supplied text as a console shows it safely: ``repr``-escaped (a newline or an ANSI
    escape cannot forge or erase a line) and cut to ``limit`` characters, saying so."""
    s = str(text)
    if len(s) <= limit:
        return repr(s)
    return f"{s[:limit]!r}... ({len(s)} characters)"
