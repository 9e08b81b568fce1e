"""The pieces generated tool-calling tasks are built from: a function archetype (what it does, the
names it may go by, its parameters), and per parameter how a question states its value.

An archetype is a family of schemas, not one schema: each task draws a name, a description,
parameter names and a parameter order from the variants, so no two tasks need show the same
signature. A parameter's ``phrase`` is how a question says its value ("from {v}", "in {v} class"),
which makes the answer's call set known by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KINDS = ("string", "integer", "number", "boolean", "enum", "array", "object")


@dataclass(frozen=True)
class Param:
    """One parameter. ``names`` are interchangeable spellings (one is drawn per task); ``pool``
    names a value pool (``values.POOLS``) for strings and array items, ``low``/``high`` bound
    numbers; ``phrase`` renders the value into the question (``{v}``), ``phrase_false`` is the
    phrase of a boolean's false value. Optional parameters have a ``default`` and appear in a
    question only sometimes; when absent, the call may leave them out or give the default."""

    names: tuple[str, ...]
    kind: str
    desc: str
    phrase: str
    required: bool = True
    pool: str = ""
    low: float = 0
    high: float = 100
    decimals: int = 0
    enum: tuple[str, ...] = ()
    phrase_false: str = ""
    default: Any = None
    fields: tuple[Param, ...] = ()  # an object's members (all required, stated in ``phrase``)
    size: tuple[int, int] = (2, 3)  # an array's item count

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"parameter kind {self.kind!r} is not one of {KINDS}")
        if not self.names:
            raise ValueError("a parameter needs at least one name")
        if self.kind == "enum" and not self.enum:
            raise ValueError(f"enum parameter {self.names[0]!r} lists no values")
        if self.kind == "object" and not self.fields:
            raise ValueError(f"object parameter {self.names[0]!r} has no fields")


@dataclass(frozen=True)
class Archetype:
    """A function family: ``names`` (snake_case stems, restyled per task), ``descs`` (one drawn
    per task), ``asks`` (question openers, e.g. "Find flights"), ``params``."""

    names: tuple[str, ...]
    descs: tuple[str, ...]
    asks: tuple[str, ...]
    params: tuple[Param, ...]
    namespaces: tuple[str, ...] = field(default=())  # dotted prefixes a name may carry
