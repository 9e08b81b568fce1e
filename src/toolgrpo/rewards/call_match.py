"""Matching a model's function calls against an expected call set, argument by argument under the
offered schemas (an AST-style check, as BFCL's single-turn categories score calls).

A call matches when its name is the expected one, every stated argument is present with an equal
value, and every other argument it gives is an optional one set to its default; nothing outside
the schema. Values compare by schema type: integers and numbers numerically (an integer may come
as 3.0), strings and enums case- and surrounding-punctuation-blind, booleans exactly, arrays as
multisets, objects member by member. Parallel calls match in any order.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_STRIP = " \t\n\"'`.,;:!?"


@dataclass(frozen=True)
class CallScore:
    """One answer's verdict: well-formed calls (``format_valid``), the right function names as a
    multiset (``names_ok``), the exact call set (``correct``)."""

    format_valid: bool
    names_ok: bool
    correct: bool


def value_matches(got: Any, want: Any, schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    if kind == "integer" or kind == "number":
        if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isfinite(got):
            return False
        return abs(float(got) - float(want)) <= 1e-6 * max(1.0, abs(float(want)))
    if kind == "boolean":
        return isinstance(got, bool) and got == want
    if kind == "string":
        return isinstance(got, str) and _norm(got) == _norm(str(want))
    if kind == "array":
        if not isinstance(got, list) or len(got) != len(want):
            return False
        items = schema.get("items", {})
        return _any_order(got, list(want), lambda g, w: value_matches(g, w, items))
    if kind == "object":
        props = schema.get("properties", {})
        if not isinstance(got, dict) or set(got) != set(want):
            return False
        return all(value_matches(got[k], want[k], props.get(k, {})) for k in want)
    return got == want


def call_matches(got: Mapping[str, Any], want: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    """``got`` (name, arguments) against ``want`` under ``spec`` (an OpenAI function spec)."""
    if got.get("name") != want["name"]:
        return False
    args = got.get("arguments")
    if not isinstance(args, dict):
        return False
    props = spec["function"]["parameters"].get("properties", {})
    stated = want["arguments"]
    if not set(args) <= set(props) or not set(stated) <= set(args):
        return False
    for key, value in args.items():
        target = stated[key] if key in stated else props[key].get("default")
        if key not in stated and "default" not in props[key]:
            return False
        if not value_matches(value, target, props[key]):
            return False
    return True


def score_calls(
    got: Sequence[Mapping[str, Any]] | None,
    want: Sequence[Mapping[str, Any]],
    functions: Sequence[Mapping[str, Any]],
) -> CallScore:
    """``got``: the parsed calls (``None`` when some block was not a well-formed call)."""
    if not got:
        return CallScore(False, False, False)
    specs = {f["function"]["name"]: f for f in functions}
    names_ok = sorted(str(c.get("name")) for c in got) == sorted(c["name"] for c in want)
    if not names_ok or len(got) != len(want):
        return CallScore(True, names_ok, False)

    def one(g: Mapping[str, Any], w: Mapping[str, Any]) -> bool:
        return w["name"] in specs and call_matches(g, w, specs[w["name"]])

    return CallScore(True, True, _any_order(list(got), list(want), one))


def _any_order(got: list[Any], want: list[Any], same: Any) -> bool:
    """A one-to-one pairing of ``got`` with ``want`` under ``same`` exists (few items: tried)."""
    if len(got) != len(want):
        return False
    if len(want) > 6:  # greedy beyond what permutations can afford
        left = list(got)
        for w in want:
            hit = next((i for i, g in enumerate(left) if same(g, w)), None)
            if hit is None:
                return False
            left.pop(hit)
        return True
    return any(
        all(same(g, w) for g, w in zip(perm, want, strict=True))
        for perm in itertools.permutations(got)
    )


def _norm(text: str) -> str:
    return " ".join(text.strip(_STRIP).casefold().split())
