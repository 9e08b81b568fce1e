"""A module whose import is slow (``@tool`` derives the schema through transformers): workers
import it before a call's deadline starts."""

from __future__ import annotations

from toolgrpo.tools import tool


@tool(isolated=True)
def decorated(n: int) -> int:
    """A tool made by the decorator: the module's name now holds a Tool, not the function.

    Args:
        n: A number.
    """
    return n * 2
