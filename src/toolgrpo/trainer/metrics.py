"""Per-step metrics from the batch and scores (pure; verl's names where verl has one)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from statistics import fmean, pstdev

import torch

from toolgrpo.rewards.scoring import Score
from toolgrpo.rollout.generator import Completion
from toolgrpo.trainer.batch import Batch


def group_stats(uids: Sequence[str], totals: Sequence[float]) -> dict[str, float]:
    """How many groups carry signal: a group whose scores are all equal has advantage 0."""
    groups: dict[str, list[float]] = defaultdict(list)
    for u, s in zip(uids, totals, strict=True):
        groups[u].append(s)
    flat = sum(1 for g in groups.values() if max(g) == min(g))
    return {"reward/groups_all_equal_frac": flat / max(len(groups), 1)}


def batch_metrics(
    batch: Batch, timing: dict[str, float], extra: dict[str, float], epoch: int
) -> dict[str, float]:
    """What every step logs, single- or multi-turn: rewards, advantages, sizes, timings."""
    totals = batch.scores_B.tolist() if batch.scores_B is not None else [0.0]
    resp = batch.response_mask_BR.sum(1)
    adv = (
        batch.advantages_BR[batch.response_mask_BR.bool()]
        if batch.advantages_BR is not None
        else None
    )
    sampled = float(resp.sum())
    m: dict[str, float] = {
        "epoch": float(epoch),
        "reward/mean": fmean(totals),
        "reward/std": pstdev(totals) if len(totals) > 1 else 0.0,
        "reward/max": max(totals),
        "reward/min": min(totals),
        "tokens/generated": sampled,
        "tokens/generated_per_s": sampled / max(timing.get("timing/gen_s", 0.0), 1e-9),
        "critic/advantages/mean": float(adv.mean()) if adv is not None and adv.numel() else 0.0,
        "critic/advantages/max": float(adv.max()) if adv is not None and adv.numel() else 0.0,
        "critic/advantages/min": float(adv.min()) if adv is not None and adv.numel() else 0.0,
        "batch/size": float(batch.size),
        "batch/empty_responses": float((resp == 0).sum()),
        **group_stats(batch.uids, totals),
        **timing,
        **extra,
    }
    by_type: dict[str, list[float]] = defaultdict(list)
    for t, s in zip(batch.task_types, totals, strict=True):
        by_type[t].append(s)
    if len(by_type) > 1:
        for t, vals in by_type.items():
            m[f"reward/{t}/mean"] = fmean(vals)
    return _floats(m)


def completion_metrics(
    completions: Sequence[Completion], scores: Sequence[Score]
) -> dict[str, float]:
    """Single-turn (RLLA) specifics: reward parts, format and exact-call rates, lengths."""
    lengths = [len(c.token_ids) for c in completions]
    tool_rows = [s for s in scores if s.exact_call is not None]
    m = {
        "reward/format/mean": fmean(s.format for s in scores),
        "reward/correctness/mean": fmean(s.correctness for s in scores),
        "reward/length/mean": fmean(s.length for s in scores),
        "reward/format_rate": fmean(float(s.format_ok) for s in scores),
        "reward/exact_call_rate": (
            fmean(float(bool(s.exact_call)) for s in tool_rows) if tool_rows else 0.0
        ),
        "response_length/mean": fmean(lengths),
        "response_length/max": float(max(lengths)),
        "response_length/clip_ratio": fmean(
            float(c.finish_reason == "length") for c in completions
        ),
        "prompt_length/mean": fmean(len(c.prompt_ids) for c in completions),
    }
    return _floats(m)


def step_metrics(
    batch: Batch,
    completions: Sequence[Completion],
    scores: Sequence[Score],
    timing: dict[str, float],
    extra: dict[str, float],
    epoch: int,
) -> dict[str, float]:
    return {**batch_metrics(batch, timing, extra, epoch), **completion_metrics(completions, scores)}


def _floats(m: dict[str, object]) -> dict[str, float]:
    return {k: float(v) if isinstance(v, (int, float, torch.Tensor)) else v for k, v in m.items()}
