"""Route names: what the router head chooses before a rollout, and the weak-label vocabulary.

Kept free of heavy imports so the config layer can validate route names without loading torch.
"""

from __future__ import annotations

ANSWER, SEARCH, CALCULATE = "ANSWER", "SEARCH", "CALCULATE"
ROUTES: tuple[str, ...] = (ANSWER, SEARCH, CALCULATE)
MIXED = "MIXED"  # a weak label only: the ground truth needs tools of several families
LABELS: tuple[str, ...] = (*ROUTES, MIXED)

# Tool families; a route other than ANSWER favours the family of the same name.
OTHER = "OTHER"
FAMILIES: tuple[str, ...] = (SEARCH, CALCULATE, OTHER)


class UnknownRoute(ValueError):
    """A route, label or family name outside the known vocabulary."""


def check_name(name: str, allowed: tuple[str, ...], what: str) -> str:
    """``name`` upper-cased if it is one of ``allowed``; raises naming the allowed values."""
    value = str(name).strip().upper()
    if value not in allowed:
        raise UnknownRoute(f"unknown {what} {name!r}; known: {', '.join(allowed)}")
    return value
