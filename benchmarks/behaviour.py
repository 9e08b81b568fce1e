"""What a policy does on held-out tasks, beside whether it succeeds: from ``toolgrpo eval`` JSONs.

Accuracy is a step function: a policy can learn to call a tool, or to write an answer in the
format the environment reads, long before it gets answers right. When an arm's accuracy does not
move, these shares say whether its behaviour did (and so why the accuracy did not):

- ``answered``: episodes whose final answer the environment could read (``has_answer``);
- ``tool_call``: episodes with at least one tool call;
- ``tool_error``: failed calls per call (calls summed over episodes);
- ``reward``: the mean reward (graded where the environment grades, e.g. search's F1).

Each is the mean over an arm's seeds of the per-seed mean over tasks. Reads the compact evals
``kept.keep_eval`` writes as well as full ones.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import fmean
from typing import Any

__all__ = ["BEHAVIOUR_KEYS", "eval_behaviour", "arm_behaviour"]

BEHAVIOUR_KEYS = ("answered", "tool_call", "tool_error", "reward")


def eval_behaviour(path: Path) -> dict[str, float]:
    """The shares of one eval JSON (every episode it kept)."""
    samples = json.loads(Path(path).read_text()).get("samples") or []
    if not samples:
        raise ValueError(f"{path} keeps no episodes: run toolgrpo eval with --samples")
    calls = sum(int(s.get("tool_calls") or 0) for s in samples)
    errors = sum(sum((s.get("tool_errors") or {}).values()) for s in samples)
    rewards = [s["reward"] for s in samples]
    rewards = [r if r is not None and math.isfinite(r) else 0.0 for r in rewards]
    return {
        "answered": fmean(
            float((s.get("reward_parts") or {}).get("has_answer", 0) > 0) for s in samples
        ),
        "tool_call": fmean(float((s.get("tool_calls") or 0) > 0) for s in samples),
        "tool_error": errors / calls if calls else 0.0,
        "reward": fmean(rewards),
    }


def arm_behaviour(paths: list[Path]) -> dict[str, Any]:
    """Each share averaged over the arm's evals (one a seed), and the per-seed values."""
    per = [eval_behaviour(p) for p in paths]
    if not per:
        return {}
    out: dict[str, Any] = {k: fmean(b[k] for b in per) for k in BEHAVIOUR_KEYS}
    out["per_seed"] = per
    return out
