"""A batch's rollout metrics, kept countable again over any of its groups.

Dynamic sampling (``algorithm.filter_groups``) samples several batches and trains only some of
their groups; it logs every rollout metric twice, over the groups it trains (the metric's own
name, as without it) and over every rollout it sampled (``sampled/`` + the name), so that no
logged number mixes the two sets (docs/observability.md).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, fields, replace

from toolgrpo.rewards.scoring import Score
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.generator import Completion
from toolgrpo.trainer.episode_metrics import episode_metrics
from toolgrpo.trainer.metrics import completion_metrics, reward_metrics

SAMPLED = "sampled/"  # the prefix of a metric counted over every batch a step sampled


@dataclass
class Samples:
    """One batch's rollouts as its metrics read them, one entry per rollout in the rollout
    stage's order: multi-turn ``episodes`` (those whose environment failed too), or single-turn
    ``completions`` with their ``scores``. ``trained``: the rollout is a row of the batch (not
    an environment failure, nor one left alone in its group by them); ``nonfinite``: its reward
    came back NaN/inf and was scored 0."""

    uids: list[str]
    task_types: list[str]
    trained: list[bool]
    nonfinite: list[bool]
    episodes: list[Episode] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
    scores: list[Score] = field(default_factory=list)
    mask_truncated: bool = False  # multi_turn.mask_truncated: truncated rows train nothing

    def metrics(self) -> dict[str, float]:
        """What the rollout stage logs for these rollouts (``reward/*`` of the batch's rows
        are the trainer's: :meth:`reward_metrics`)."""
        if self.completions:
            return completion_metrics(self.completions, self.scores)
        if not self.episodes:
            return {}
        m = episode_metrics(self.episodes)
        kept = [e for e, t in zip(self.episodes, self.trained, strict=True) if t]
        m["rollout/dropped_episodes"] = float(len(self.episodes) - len(kept))
        # Truncated episodes among those trained; with mask_truncated, the rows that train nothing.
        truncated = sum(e.truncated for e in kept)
        m["rollout/truncated_frac"] = truncated / len(kept) if kept else 0.0
        m["rollout/truncated_masked"] = float(truncated if self.mask_truncated else 0)
        return m

    def reward_metrics(self) -> dict[str, float]:
        """``reward/mean``, ``std``, ``max``, ``min``, per type and ``groups_all_equal_frac``
        of the rollouts that are batch rows, as the trainer computes them from a batch."""
        rows = [i for i, t in enumerate(self.trained) if t]
        if self.completions:
            totals = [self.scores[i].total for i in rows]
        else:
            totals = [self.episodes[i].reward for i in rows]
        return reward_metrics(
            totals, [self.uids[i] for i in rows], [self.task_types[i] for i in rows]
        )

    def select(self, groups: Collection[str]) -> Samples:
        """The rollouts of the GRPO groups (uids) in ``groups``."""
        idx = [i for i, u in enumerate(self.uids) if u in groups]
        return replace(self, **{k: [v[i] for i in idx] for k, v in _rows(self).items()})


def _rows(s: Samples) -> dict[str, list]:
    """The per-rollout lists that are set (a single-turn batch has no episodes, and so on)."""
    lists = {f.name: getattr(s, f.name) for f in fields(s)}
    return {k: v for k, v in lists.items() if isinstance(v, list) and v}


def join(parts: Sequence[Samples]) -> Samples:
    """The rollouts of several batches of one run, in order."""
    if not parts:
        return Samples([], [], [], [])
    out: dict[str, list] = {}
    for p in parts:
        for k, v in _rows(p).items():
            out.setdefault(k, []).extend(v)
    return replace(parts[0], **out)


def recount(parts: Sequence[Samples], trained: Collection[str]) -> tuple[dict[str, float], float]:
    """Every rollout metric over the groups in ``trained`` under its own name, and over every
    rollout in ``parts`` under ``sampled/`` (``reward/*`` and ``reward/nonfinite`` included);
    with the trained rows' count of non-finite rewards (the trainer's ``reward/nonfinite``)."""
    every = join(parts)
    mine = every.select(trained)
    sampled = {**every.metrics(), **every.reward_metrics()}
    sampled["reward/nonfinite"] = float(sum(every.nonfinite))
    m = mine.metrics()
    m.update({SAMPLED + k: v for k, v in sampled.items()})
    return m, float(sum(mine.nonfinite))
