"""The served head's budget offset: one shift δ of the ANSWER logit that makes the head's
sampled routes spend the budget on tasks drawn from training.

Training holds the *running* mean cost near B, step by step, while λ and the head chase each
other; the head that validation, eval and infer route with (``router.head_ema``'s average, at the
end of a finite run) can sit off B. Measured on the shipped router config: the last 20 steps
spent 0.268 at B = 0.3 and the served head 0.245 on the held-out tasks (docs/router.md). δ moves
P(ANSWER) against every tool route alike (the tool routes keep their ratios), so the expected
cost is monotone in δ and one bisection finds the δ that spends B.

Complementary slackness decides which way δ may go: while the dual variable is positive the
budget binds and the cost is fit to B (δ of either sign); when it is 0 the head spends less by
its own choice, and δ only caps the cost at B (δ ≥ 0). The fit reads a table of tasks played
under every route (``eval.routed``'s ``per_task``: the head's probabilities and each route's
mean cost), which ``eval.offset_fit`` plays on training tasks; it is stored in ``router.pt``
(``OFFSET_KEY``) and applied wherever the served head routes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from statistics import fmean
from typing import Any

from toolgrpo.router.routes import ANSWER

OFFSET_KEY = "answer_offset"  # router.pt's entry (absent before the offset existed)
BOUND = 8.0  # |δ| at most: e^8 ≈ 3000× the odds of ANSWER either way
_STEPS = 60  # bisection halvings: far below float noise in δ


@dataclass(frozen=True)
class AnswerOffset:
    """A fitted δ and what it did on the tasks it was fit on."""

    delta: float  # added to the ANSWER logit of the served head
    budget: float
    spend_before: float  # the served head's expected cost per task on the fit's tasks, δ = 0
    spend: float  # at δ
    tasks: int
    binding: bool  # the dual was positive: cost fit to B (else only capped at B)
    feasible: bool  # False: |δ| hit BOUND before the cost reached B
    step: int = -1  # the training step of the head it was fit for

    def to_state(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, d: Any) -> AnswerOffset | None:
        """None for a missing or unreadable entry (a ``router.pt`` from before the offset)."""
        if not isinstance(d, Mapping):
            return None
        try:
            return cls(
                float(d["delta"]),
                float(d["budget"]),
                float(d["spend_before"]),
                float(d["spend"]),
                int(d["tasks"]),
                bool(d["binding"]),
                bool(d["feasible"]),
                int(d.get("step", -1)),
            )
        except (KeyError, TypeError, ValueError):
            return None


def shifted(probs: Sequence[float], routes: Sequence[str], delta: float) -> list[float]:
    """Route probabilities with ``delta`` added to ANSWER's logit (softmax of log p + δ·e_A)."""
    a = list(routes).index(ANSWER)
    w = [p * (math.exp(delta) if i == a else 1.0) for i, p in enumerate(probs)]
    total = sum(w)
    return [x / total for x in w]


def unshift_rows(rows: Sequence[Mapping[str, Any]], delta: float) -> list[dict[str, Any]]:
    """``per_task`` rows with the offset δ taken out of their route probabilities: the head as
    it was without it, read off the same episodes."""
    out = []
    for row in rows:
        routes = list(row["probs"])
        p = shifted([row["probs"][r] for r in routes], routes, -delta)
        out.append({**row, "probs": dict(zip(routes, p, strict=True))})
    return out


def expected_cost(rows: Sequence[Mapping[str, Any]], routes: Sequence[str], delta: float) -> float:
    """Mean over tasks of Σ_r p_δ(r) · cost(r) (``per_task`` rows: every route played)."""

    def one(row: Mapping[str, Any]) -> float:
        p = shifted([row["probs"][r] for r in routes], routes, delta)
        return sum(q * row["cost"][r] for q, r in zip(p, routes, strict=True))

    return fmean(one(row) for row in rows)


def fit_answer_offset(
    rows: Sequence[Mapping[str, Any]],
    routes: Sequence[str],
    budget: float,
    binding: bool,
    step: int = -1,
) -> AnswerOffset:
    """The δ whose served head spends ``budget`` on ``rows`` (``binding``), or at most it (not
    binding: δ = 0 when the head already spends no more). Every row needs a cost for every
    route; ANSWER must cost no more than the tool routes for the cost to fall as δ grows
    (bisection assumes it; a row where it does not only slows the fall)."""
    if ANSWER not in routes:
        raise ValueError("the budget offset shifts the ANSWER route, which routes lacks")
    missing = [row.get("task_id") for row in rows if set(routes) - set(row["cost"])]
    if missing or not rows:
        raise ValueError(
            f"the budget offset needs every route's cost on every task ({len(missing)} lack one)"
            if rows
            else "the budget offset needs at least one task"
        )
    before = expected_cost(rows, routes, 0.0)
    lo, hi = (-BOUND if binding else 0.0), BOUND
    if not binding and before <= budget:
        delta, feasible = 0.0, True
    elif expected_cost(rows, routes, lo) <= budget:  # binding, yet under B even at δ = −BOUND
        delta, feasible = lo, False
    elif expected_cost(rows, routes, hi) > budget:  # ANSWER almost always and still above B
        delta, feasible = hi, False
    else:
        for _ in range(_STEPS):  # cost(lo) > B ≥ cost(hi)
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if expected_cost(rows, routes, mid) > budget else (lo, mid)
        delta, feasible = hi, True
    spend = expected_cost(rows, routes, delta)
    return AnswerOffset(delta, budget, before, spend, len(rows), binding, feasible, step)
