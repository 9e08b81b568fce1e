"""Mixed groups (``rollout_allocation_schedule.groups=mixed``, beyond the design): fixed-policy
samples inside the actor's GRPO groups.

With whole groups (the design's, the default) a prompt's group is sampled by one policy, so a
group of actor failures has every advantage 0 whatever the fixed policy knows. Mixed, each
prompt the schedule gives a fixed policy keeps the actor's n samples *and* gets k samples of the
fixed policy; the fixed rows take the actor group's uid, so GRPO's mean (and std) run over all
n + k members. An all-fail actor group with one fixed success then gets a negative advantage on
every actor member and a positive one on the success (LUFFY: 7 actor rollouts + 1 teacher trace,
advantages over the mixed group).

Pure functions over the parts of a step and what they sampled; ``Mixture`` calls them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from toolgrpo.mixture.schedule import ACTOR

GROUP_MODES = ("whole", "mixed")


def _uid(item: Any) -> str:
    """An episode's uid, or the uid of a (completion, uid, task) triple."""
    return item[1] if isinstance(item, tuple) else item.uid


def _relabel(item: Any, uid: str) -> Any:
    """The item in group ``uid``: a new triple, or the episode (and its rolled-back negatives,
    which rank inside their parent's group) relabelled in place."""
    if isinstance(item, tuple):
        return (item[0], uid, *item[2:])
    item.uid = uid
    if getattr(item, "negatives", None):  # frozen dataclasses: replaced, not mutated
        item.negatives = [replace(neg, uid=uid) for neg in item.negatives]
    return item


def _chunks(items: Sequence[Any], n: int) -> list[Sequence[Any]]:
    return [items[s : s + n] for s in range(0, len(items), n)]


def join_groups(parts: Sequence[Any], items: Sequence[Any]) -> list[Any]:
    """``items`` (every part's samples, part after part, each part's ``params.n`` per task in task
    order, as generation returns them) with each fixed sample moved into its task's actor group.

    A part's ``groups`` lists, per task, its index among the step's tasks (None: a whole-group
    part, left as it is). Raises ValueError when the items are not laid out as said."""
    if all(getattr(p, "groups", None) is None for p in parts):
        return list(items)
    sizes = [len(p.tasks) * p.params.n for p in parts]
    if sum(sizes) != len(items):
        raise ValueError(f"{len(items)} samples for parts that sampled {sizes}")
    spans, start = [], 0
    for size in sizes:
        spans.append(items[start : start + size])
        start += size
    actor_uid: dict[int, str] = {}
    for p, got in zip(parts, spans, strict=True):
        where = p.groups if p.groups is not None else range(len(p.tasks))
        for g, chunk in zip(where, _chunks(got, p.params.n), strict=True):
            uids = {_uid(x) for x in chunk}
            if len(uids) != 1:
                raise ValueError(f"{p.policy}'s samples of task {g} span groups {sorted(uids)}")
            if p.policy == ACTOR:
                actor_uid[g] = uids.pop()
    out: list[Any] = []
    for p, got in zip(parts, spans, strict=True):
        if p.policy == ACTOR or p.groups is None:
            out.extend(got)
            continue
        for g, chunk in zip(p.groups, _chunks(got, p.params.n), strict=True):
            if g not in actor_uid:
                raise ValueError(f"{p.policy} sampled task {g}, which has no actor group")
            out.extend(_relabel(x, actor_uid[g]) for x in chunk)
    return out


def group_signal_metrics(
    uids: Sequence[str],
    policies: Sequence[str],
    scores: Sequence[float],
    is_negative: Sequence[bool] = (),
) -> dict[str, float]:
    """Over the step's groups (real rows only: rolled-back negatives are nobody's samples):
    ``mixture/mixed_group_frac``, the share holding samples of the actor and of a fixed policy;
    ``mixture/rescued_group_frac``, the share whose actor samples all scored the same (zero
    advantage on their own) but whose fixed samples scored otherwise, so the actor's samples get
    a non-zero advantage only because the group is mixed."""
    groups: dict[str, list[tuple[str, float]]] = {}
    for i, (u, p, s) in enumerate(zip(uids, policies, scores, strict=True)):
        if not (is_negative and is_negative[i]):
            groups.setdefault(u, []).append((p, s))
    if not groups:
        return {}
    mixed = rescued = 0
    for members in groups.values():
        actor = {s for p, s in members if p == ACTOR}
        fixed = {s for p, s in members if p != ACTOR}
        if actor and fixed:
            mixed += 1
            rescued += len(actor) == 1 and bool(fixed - actor)
    return {
        "mixture/mixed_group_frac": mixed / len(groups),
        "mixture/rescued_group_frac": rescued / len(groups),
    }
