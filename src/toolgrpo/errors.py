"""The family of errors a user can fix (a config value, a data file, a model directory).

``toolgrpo`` prints them as one line and exits 2; any other exception is a bug and keeps its
traceback. Subclasses stay ``ValueError`` so library callers that caught that still do.
"""

from __future__ import annotations


class UserError(ValueError):
    """Input the user got wrong; the message alone says what and where."""


def one_line(e: BaseException) -> str:
    """An exception's message on one line (multi-line messages joined with ' | ')."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return " | ".join(lines) or type(e).__name__
