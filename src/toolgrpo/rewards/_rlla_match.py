"""Tool-call matching for the RLLA correctness reward (ToolRL ``compute_tool_call_reward``).

The functions here deliberately index into the parsed calls without checking them first:
ToolRL scores a prediction inside a catch-all, so any malformed predicted call (a list where a
dict is expected, a missing ``parameters`` on a name-matched call, an unhashable name, ...) must
fail exactly where ToolRL's version fails. The caller turns every such exception into the
minimum correctness.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

__all__ = ["list_match", "score_tool_calls"]


def list_match(a: list[Any], b: list[Any], refined: bool = False) -> float:
    """Multiset Jaccard of two lists (1.0 if equal as lists); ``refined`` keeps only equality.

    This is ToolRL's ``match_score``: used for call names and for parameter keys.
    """
    if a == b:
        return 1.0
    if refined:
        return 0.0
    if not a or not b:
        return 0.0
    count_a = Counter(a)
    count_b = Counter(b)
    common = sum(min(count_a[k], count_b[k]) for k in count_a.keys() & count_b.keys())
    return common / (len(a) + len(b) - common)


def _pair_score(gt_params: Any, pred_call: Any, refined: bool) -> float:
    """Key-Jaccard plus the number of GT params whose value the prediction repeats (Python ==)."""
    pred_params = pred_call["parameters"]
    key_score = list_match(list(gt_params.keys()), list(pred_params.keys()), refined)
    same_values = sum(1.0 for k, v in gt_params.items() if k in pred_params and pred_params[k] == v)
    return key_score + same_values


def score_tool_calls(
    gt_calls: list[Any],
    pred_calls: list[Any],
    hi: float,
    lo: float,
    *,
    refined: bool = False,
    intermediate: bool = False,
    coarse: bool = False,
) -> float:
    """Correctness in ``[lo, hi]`` of predicted calls against GT calls, greedy in GT order.

    May raise (KeyError, TypeError, AttributeError, ...) on malformed predicted calls, exactly
    where ToolRL would; the caller maps that to ``lo``.
    """
    if gt_calls == pred_calls:
        return hi
    if coarse:
        return lo

    score = list_match([c["name"] for c in gt_calls], [c["name"] for c in pred_calls], refined)
    denom = 1.0
    used: set[int] = set()
    for gt_call in gt_calls:
        name = gt_call["name"]
        gt_params = gt_call["parameters"]
        if intermediate:
            denom += 1.0
        else:
            denom += 1.0 + len(gt_params)

        best_index = -1
        best_score = 0.0
        for i, pred_call in enumerate(pred_calls):
            if i in used or pred_call["name"] != name:
                continue
            if intermediate:
                if gt_call == pred_call:
                    best_index, best_score = i, 1.0
                    break
                continue
            pair = _pair_score(gt_params, pred_call, refined)
            if pair > best_score:  # strictly larger: first best wins, and 0 never matches
                best_index, best_score = i, pair

        if best_index >= 0:
            used.add(best_index)
            score += best_score

    return (hi - lo) * score / denom + lo
