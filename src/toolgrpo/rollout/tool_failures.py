"""What counts as a failed tool result beyond its error flag: output matching a regex (a code
tool that printed a traceback and "succeeded") or JSON that sets an error field (a simulator's
``{"error": "..."}`` reply). Used by tool rollback (``rollout.rollback``)."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from typing import Any

from toolgrpo.tools.types import ToolResult

_EXCEPTION_NAME = re.compile(r"\b([A-Z]\w*(?:Error|Exception))\b")
_MAX_STRUCTURED_CHARS = 100_000  # longer output is not parsed for an error field


def compile_patterns(patterns: Sequence[str]) -> tuple[re.Pattern[str], ...]:
    """Compiled regexes; a bad one raises ValueError naming it and its position."""
    out = []
    for i, p in enumerate(patterns):
        try:
            out.append(re.compile(p))
        except re.error as e:
            raise ValueError(f"pattern [{i}] {p!r} is not a valid regex: {e}") from None
    return tuple(out)


def json_error(text: str, keys: Sequence[str]) -> bool:
    """True when ``text`` is a JSON object (or a non-empty list of them) with a non-empty value
    under one of ``keys``: null, false, 0, "" and empty containers mean "no error". Python
    literals are read too, since BFCL shows results that JSON cannot encode with ``str``."""
    t = text.strip()
    if not keys or not t or t[0] not in "{[" or len(t) > _MAX_STRUCTURED_CHARS:
        return False
    try:
        value = json.loads(t)
    except ValueError:
        try:
            value = ast.literal_eval(t)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return False
    items = value if isinstance(value, list) else [value]
    return bool(items) and all(
        isinstance(x, dict) and any(_is_set(x.get(k)) for k in keys) for x in items
    )


def _is_set(value: Any) -> bool:
    return bool(value.strip()) if isinstance(value, str) else bool(value)


def error_type(r: ToolResult) -> str:
    """A failed result's type for the record: the flagged one, else the exception it names,
    else ``json_error`` or ``pattern``."""
    if r.is_error and r.error_type:
        return r.error_type
    m = _EXCEPTION_NAME.search(r.text)
    return m.group(1) if m else "json_error" if r.text.lstrip()[:1] in ("{", "[") else "pattern"
