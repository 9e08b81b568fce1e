"""Generated tool-calling tasks (``schemas:test``, ``schemas:train``): calls to functions the
model has never seen, in both prompt styles, scored by ``rewards.call_match``.

``schemas:SPLIT[?style=native|rlla&n=N&seed=S]``: ``n`` items (240 for test, 1200 for train),
each rendered in every style unless ``style`` picks one; ``seed`` draws another set.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from toolgrpo.data.task import Task
from toolgrpo.errors import UserError

_ARGS = ("style", "n", "seed")


def schema_tasks(spec: str) -> list[Task]:
    """The tasks ``spec`` names, styles interleaved per item; a bad spec raises ``UserError``."""
    from toolgrpo.data.schema_tasks.generate import SPLITS, STYLES, generate_items, item_task

    head, _, query = spec.partition("?")
    kind, _, split = head.partition(":")
    if kind != "schemas" or split not in SPLITS:
        raise UserError(
            f"bad data source {spec!r}: want schemas:SPLIT[?style=native|rlla&n=N&seed=S] "
            f"(SPLIT one of {', '.join(SPLITS)})"
        )
    try:
        args = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))
    except ValueError as e:
        raise UserError(f"bad data source {spec!r}: arguments must be key=value&... ({e})") from e
    unknown = sorted(set(args) - set(_ARGS))
    if unknown:
        raise UserError(f"bad data source {spec!r}: unknown argument(s) {unknown} (have {_ARGS})")
    styles = STYLES if "style" not in args else (args["style"],)
    if styles[0] not in STYLES:
        raise UserError(f"bad data source {spec!r}: style must be one of {STYLES}")
    try:
        n = int(args["n"]) if "n" in args else None
        seed = int(args["seed"]) if "seed" in args else None
    except ValueError:
        raise UserError(f"bad data source {spec!r}: n and seed must be whole numbers") from None
    if n is not None and n < 1:
        raise UserError(f"bad data source {spec!r}: n must be at least 1")
    items = generate_items(split, n, seed)
    return [
        item_task(item, i, split, style, head) for i, item in enumerate(items) for style in styles
    ]
