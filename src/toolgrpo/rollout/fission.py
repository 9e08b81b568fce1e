"""Fission (Fission-GRPO, arXiv 2601.15625): a failed tool call becomes a new training prompt.

At an episode's first failed call that another turn follows, the trajectory up to the error, with
the environment's error message as the tool result and the next generation prompt, is kept as a
``ForkPoint`` together with the environment's state (``asnapshot``). The episode itself goes on
as sampled: its failure stands and it trains in its own group under its own reward. Once a step's
episodes are played, up to ``max_forks_per_step`` fork points (each task's first failing episode
before any task's second) each get ``fission_group_size`` continuations, sampled on-policy from
the fork point in a fresh environment restored to the saved state, and trained as their own GRPO
group (a fresh uid) beside the original one. The paper's error simulator is not used: the
environment's own error message is the feedback.

A continuation is an ``Episode`` whose prompt is the fork point (so only its own turns train) and
whose response budget is what the parent had left; it hangs off its parent (``Episode.forks``) so
that every list of a step's episodes keeps ``n`` per task, and its rows follow the step's
episodes and negatives in the batch (``trainer.batch.collate_episodes``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.rollback import RollbackPolicy
from toolgrpo.rollout.rollback_checks import SnapshotUnsupported, unsupported_message
from toolgrpo.tools.types import ToolResult


@dataclass(frozen=True)
class ForkPoint:
    """A failed call's trajectory as a new prompt, and what a continuation needs to go on."""

    task: Task
    parent_uid: str
    prompt_ids: list[int]  # the parent's prompt and response through the error's delta
    stream_text: str  # those tokens decoded
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None  # the ``tools=`` the prompt was rendered with
    num_turns: int
    spent: int  # response tokens of the parent before the fork (its budget is shared)
    step_rewards: list[float]
    env_state: Any
    errors: list[str]  # the failed results' texts: the feedback the continuations see


@dataclass
class ForkRecorder:
    """Fission's hook in the episode loop: ``after_tools`` counts a failed turn and, at the
    episode's first, saves the environment's state; ``after_delta`` (once the results and the
    next generation prompt are appended) records the fork point."""

    policy: RollbackPolicy
    task: Task
    tools: list[dict[str, Any]] | None
    point: ForkPoint | None = None
    _state: Any = None
    _errors: list[str] = field(default_factory=list)
    _pending: bool = False  # a fork point's state is saved; its delta is not appended yet

    async def after_tools(
        self, ep: Episode, env: Env, results: Sequence[ToolResult], forkable: bool
    ) -> None:
        """Every failed turn is counted; one that another turn follows (``forkable``: not
        ``done``, not the last) and is the episode's first failure is a fork point."""
        failed = self.policy.failures(results)
        if not failed or env.fatal_error:
            return
        ep.rollback.failed += 1
        if not forkable or ep.rollback.failed > 1:
            return  # one fork per episode: at its first failure, if a turn follows it
        self._state = await env.asnapshot()
        self._errors = [r.text for r in failed]
        self._pending = not env.fatal_error

    def after_delta(self, ep: Episode, stream_text: str, messages: list[dict[str, Any]]) -> None:
        if not self._pending:
            return
        self._pending = False
        self.point = ForkPoint(
            task=self.task,
            parent_uid=ep.uid,
            prompt_ids=ep.prompt_ids + ep.response_ids,
            stream_text=stream_text,
            messages=copy.deepcopy(messages),
            tools=self.tools,
            num_turns=ep.num_turns,
            spent=len(ep.response_ids),
            step_rewards=list(ep.step_rewards),
            env_state=self._state,
            errors=self._errors,
        )

    def drop(self) -> None:
        """The delta after the failure did not fit: no turn follows it, so no fork either."""
        self._pending = False


def make_recorder(
    env: Env, task: Task, policy: RollbackPolicy | None, tools: list[dict[str, Any]] | None
) -> ForkRecorder | None:
    """The episode's recorder (after ``reset``), ``None`` unless fission is on and the
    environment runs tools. Continuations restore the saved state into a new instance, so the
    environment must snapshot, and in-process: a remote one's snapshots live in its session."""
    if policy is None or policy.mode != "fission" or env.single_turn or env.owns_turn:
        return None
    if not env.supports_snapshot or env.snapshot_known_at_reset:
        raise SnapshotUnsupported(unsupported_message(task.task_type, env, mode="fission"))
    return ForkRecorder(policy, task, tools)


def select_forks(points: Sequence[ForkPoint | None], n: int, cap: int | None) -> list[int]:
    """Which episodes fork (indices into ``points``, one entry per episode, ``n`` per task):
    every task's first failing episode, then every task's second, ..., up to ``cap``."""
    ranked: list[tuple[int, int, int]] = []
    seen: dict[int, int] = {}
    for i, p in enumerate(points):
        if p is None:
            continue
        task = i // n
        ranked.append((seen.get(task, 0), task, i))
        seen[task] = seen.get(task, 0) + 1
    ranked.sort()
    chosen = [i for _, _, i in ranked]
    return sorted(chosen if cap is None else chosen[:cap])


def keep_trainable(forks: list[Episode]) -> list[Episode]:
    """A fork group without the continuations whose environment failed; empty when fewer than
    two are left (one alone has no baseline). Failed continuations are not counted against
    ``max_env_failure_ratio``: they are extra rows, not the step's episodes."""
    ok = [e for e in forks if e.env_failure is None]
    return ok if len(ok) >= 2 else []


def with_forks(episodes: Sequence[Episode]) -> tuple[list[Episode], list[int]]:
    """The episodes followed by every fission continuation, and each continuation's parent's
    index (for lists kept per episode, e.g. who sampled it)."""
    forks = [(i, f) for i, e in enumerate(episodes) for f in e.forks]
    return [*episodes, *(f for _, f in forks)], [i for i, _ in forks]
