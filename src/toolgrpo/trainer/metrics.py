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


def reward_metrics(
    totals: Sequence[float], uids: Sequence[str], task_types: Sequence[str]
) -> dict[str, float]:
    """``reward/*`` of a batch's real rows: mean, spread, per task type (when there are
    several) and the share of groups with nothing to learn from."""
    totals, uids = list(totals) or [0.0], list(uids) or [""]
    m = {
        "reward/mean": fmean(totals),
        "reward/std": pstdev(totals) if len(totals) > 1 else 0.0,
        "reward/max": max(totals),
        "reward/min": min(totals),
        **group_stats(uids, totals),
    }
    by_type: dict[str, list[float]] = defaultdict(list)
    for t, s in zip(task_types, totals, strict=False):
        by_type[t].append(s)
    if len(by_type) > 1:
        for t, vals in by_type.items():
            m[f"reward/{t}/mean"] = fmean(vals)
    return m


def batch_metrics(
    batch: Batch, timing: dict[str, float], extra: dict[str, float], epoch: int
) -> dict[str, float]:
    """What every step logs, single- or multi-turn: rewards, advantages, sizes, timings.
    ``reward/*`` describe real rollouts: negative samples (scored ``negative_reward``, not by
    an environment) are left out and reported by ``negative_metrics``."""
    scores = batch.scores_B.tolist() if batch.scores_B is not None else []
    real = [i for i in range(len(scores)) if not (batch.is_negative and batch.is_negative[i])]
    resp = batch.response_mask_BR.sum(1)
    adv = (
        batch.advantages_BR[batch.response_mask_BR.bool()]
        if batch.advantages_BR is not None
        else None
    )
    sampled = float(resp.sum())
    types = [batch.task_types[i] for i in real] if batch.task_types else []
    m: dict[str, float] = {
        "epoch": float(epoch),
        **reward_metrics([scores[i] for i in real], [batch.uids[i] for i in real], types),
        "tokens/generated": sampled,
        "tokens/generated_per_s": sampled / max(timing.get("timing/gen_s", 0.0), 1e-9),
        "critic/advantages/mean": float(adv.mean()) if adv is not None and adv.numel() else 0.0,
        "critic/advantages/max": float(adv.max()) if adv is not None and adv.numel() else 0.0,
        "critic/advantages/min": float(adv.min()) if adv is not None and adv.numel() else 0.0,
        "batch/size": float(batch.size),
        "batch/empty_responses": float((resp == 0).sum()),
        **timing,
        **extra,
    }
    return _floats(m)


def negative_metrics(batch: Batch) -> dict[str, float]:
    """Negative samples' rows after advantages: how many, and the advantages they got (each
    row's one value, read from its trained tokens). ``negative_zero_advantage_frac`` counts those
    clamped to 0 or left without a baseline: they train nothing."""
    rows = [i for i, neg in enumerate(batch.is_negative) if neg]
    if not rows or batch.advantages_BR is None:
        return {"rollout/negative_rows": float(len(rows))} if rows else {}
    mask = batch.response_mask_BR[rows] != 0
    per_row = (batch.advantages_BR[rows] * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    vals = [float(v) for v in per_row]
    return {
        "rollout/negative_rows": float(len(rows)),
        "rollout/negative_advantage_mean": fmean(vals),
        "rollout/negative_advantage_min": min(vals),
        "rollout/negative_zero_advantage_frac": fmean(float(v == 0.0) for v in vals),
    }


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


def no_signal(metrics: dict[str, float], group_estimator: bool = True) -> str | None:
    """Why a step's batch cannot move the policy, naming the metric that shows it; else None.

    Every reward non-finite (scored 0 under ``reward.nan_policy=zero``), or, for the group
    estimators (grpo, dr_grpo, rloo), every group's scores equal: every advantage is then 0.
    """
    size = metrics.get("batch/size", 0.0)
    bad = metrics.get("reward/nonfinite", 0.0)
    if size > 0 and bad >= size:
        return f"every reward was non-finite (reward/nonfinite={bad:g} of batch/size={size:g})"
    if group_estimator and metrics.get("reward/groups_all_equal_frac", 0.0) >= 1.0:
        return (
            "every group's scores were all equal, so every advantage is 0 "
            "(reward/groups_all_equal_frac=1)"
        )
    return None


class NoSignalWatch:
    """Counts steps in a row without learning signal; says so at ``steps`` of them (and every
    ``steps`` more), so a run that cannot learn does not look like one that is learning slowly."""

    def __init__(self, steps: int, group_estimator: bool = True) -> None:
        self.steps = steps
        self.group_estimator = group_estimator
        self.run = 0

    def observe(self, metrics: dict[str, float]) -> str | None:
        reason = no_signal(metrics, self.group_estimator)
        self.run = self.run + 1 if reason is not None else 0
        if self.steps <= 0 or reason is None or self.run % self.steps:
            return None
        return (
            f"no learning signal for {self.run} steps in a row: {reason}; the policy is not "
            "being trained (check the reward function and data, or sample more diverse groups: "
            "actor_rollout_ref.rollout.n / temperature)"
        )
