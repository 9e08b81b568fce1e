"""Task sources named by one string in ``data.train_files``: ``kind:name[:split][?key=value&...]``
(``reasoning_gym:products:test?size=50``, ``verifiers:my-env?num_examples=20``).

A value is read as JSON when it parses (``size=50`` an int, ``flag=true`` a bool, ``xs=[1,2]`` a
list), else kept as text, so sizes and seeds reach the source as numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from toolgrpo.errors import DataError


@dataclass(frozen=True)
class SourceSpec:
    kind: str  # "reasoning_gym", "verifiers"
    name: str  # the dataset or environment id
    split: str
    args: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        """The spec without its arguments: what task ids start with."""
        return f"{self.kind}:{self.name}:{self.split}"


def parse_source_spec(spec: str, kind: str, splits: tuple[str, ...]) -> SourceSpec:
    """``kind:name[:split][?k=v&...]``; the first of ``splits`` is the default."""
    head, _, query = spec.partition("?")
    parts = head.split(":")
    if parts[0] != kind or len(parts) not in (2, 3) or not parts[1].strip():
        raise DataError(
            f"bad data source {spec!r}: want {kind}:NAME[:SPLIT][?key=value&...] "
            f"(SPLIT one of {', '.join(splits)})"
        )
    split = parts[2] if len(parts) == 3 else splits[0]
    if split not in splits:
        raise DataError(f"bad data source {spec!r}: split {split!r} is not one of {splits}")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as e:
        raise DataError(f"bad data source {spec!r}: arguments must be key=value&... ({e})") from e
    args: dict[str, Any] = {}
    for key, raw in pairs:
        if not key.isidentifier():
            raise DataError(f"bad data source {spec!r}: {key!r} is not an argument name")
        if key in args:
            raise DataError(f"bad data source {spec!r}: argument {key!r} given twice")
        args[key] = _value(raw)
    return SourceSpec(kind, parts[1].strip(), split, args)


def _value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw
