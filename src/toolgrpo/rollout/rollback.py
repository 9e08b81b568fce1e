"""Tool-call rollback (issue #6): when a turn's tool results look like a failure, put the episode
and its environment back to where they were before that assistant turn and sample it again.

The failed attempt can be kept as a ``NegativeSample``: it joins its task's GRPO group as an extra
member scored ``negative_reward``. Only the failing turn is trained in it (mask 1); the shared
prefix is masked out, since the parent episode already carries those turns with its own reward.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from toolgrpo.config.schema import (
    ROLLBACK_ERROR_JSON_KEYS,
    ROLLBACK_ERROR_PATTERNS,
    ROLLBACK_ERROR_TYPES,
)
from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env
from toolgrpo.envs.registry import EnvConfigError, EnvRouter
from toolgrpo.tools.types import ToolCall, ToolResult

if TYPE_CHECKING:
    from toolgrpo.rollout.episode import Episode

_EXCEPTION_NAME = re.compile(r"\b([A-Z]\w*(?:Error|Exception))\b")
_MAX_STRUCTURED_CHARS = 100_000  # longer output is not parsed for an error field


class SnapshotUnsupported(EnvConfigError):
    """Rollback is on but an environment cannot snapshot its state: a setup error, so it stops
    the run instead of silently wasting episodes."""


def compile_patterns(patterns: Sequence[str]) -> tuple[re.Pattern[str], ...]:
    """Compiled regexes; a bad one raises ValueError naming it and its position."""
    out = []
    for i, p in enumerate(patterns):
        try:
            out.append(re.compile(p))
        except re.error as e:
            raise ValueError(f"pattern [{i}] {p!r} is not a valid regex: {e}") from None
    return tuple(out)


@dataclass(frozen=True)
class RollbackPolicy:
    """What counts as a failed tool turn and what to do about it (from ``MultiTurnConfig``)."""

    max_retries: int = 2  # re-samplings of one failing turn; then the last failure stands
    save_negatives: bool = True
    max_negatives_per_group: int = 2  # over all G episodes of a task, not per episode
    negative_reward: float = -1.0
    patterns: tuple[re.Pattern[str], ...] = field(
        default_factory=lambda: compile_patterns(ROLLBACK_ERROR_PATTERNS)
    )
    error_types: frozenset[str] = frozenset(ROLLBACK_ERROR_TYPES)
    json_error_keys: tuple[str, ...] = ROLLBACK_ERROR_JSON_KEYS

    @classmethod
    def from_config(cls, mt: Any) -> RollbackPolicy | None:
        """``None`` when rollback is off or allows no retry: the loop then takes no snapshots
        and needs none."""
        if not mt.enable_tool_rollback or mt.max_tool_retries == 0:
            return None
        return cls(
            max_retries=int(mt.max_tool_retries),
            save_negatives=bool(mt.save_negative_samples),
            max_negatives_per_group=int(mt.max_negative_samples_per_group),
            negative_reward=float(mt.negative_reward),
            patterns=compile_patterns(mt.rollback_error_patterns),
            error_types=frozenset(mt.rollback_error_types),
            json_error_keys=tuple(mt.rollback_error_json_keys),
        )

    def failures(self, results: Sequence[ToolResult]) -> list[ToolResult]:
        """Results that trigger a rollback: a flagged error of a listed type, or an ordinary
        result whose text matches a pattern (a code tool may print a traceback and "succeed")
        or whose JSON sets an error field (a simulator's ``{"error": "..."}`` reply)."""
        return [
            r
            for r in results
            if (r.error_type in self.error_types if r.is_error else self._matches(r.text))
        ]

    def _matches(self, text: str) -> bool:
        return any(p.search(text) for p in self.patterns) or json_error(text, self.json_error_keys)


def json_error(text: str, keys: Sequence[str]) -> bool:
    """True when ``text`` is a JSON object (or a non-empty list of them) with a non-empty value
    under one of ``keys``: null, false, 0, "" and empty containers mean "no error". Python
    literals are read too, since BFCL shows results that JSON cannot encode with ``str``."""
    t = text.strip()
    if not keys or not t or t[0] not in "{[" or len(t) > _MAX_STRUCTURED_CHARS:
        return False
    try:
        value = json.loads(t)
    except ValueError:
        try:
            value = ast.literal_eval(t)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return False
    items = value if isinstance(value, list) else [value]
    return bool(items) and all(
        isinstance(x, dict) and any(_is_set(x.get(k)) for k in keys) for x in items
    )


def _is_set(value: Any) -> bool:
    return bool(value.strip()) if isinstance(value, str) else bool(value)


@dataclass
class NegativeBudget:
    """The negatives one GRPO group may still keep; shared by the group's concurrent episodes
    (asyncio runs them on one thread, so a plain counter is safe)."""

    limit: int
    used: int = 0

    def take(self) -> bool:
        if self.used >= self.limit:
            return False
        self.used += 1
        return True


@dataclass(frozen=True)
class NegativeSample:
    """A rolled-back attempt, as a training row: the parent's prompt and response up to and
    including the failing turn (no tool output), only that turn's tokens with mask 1."""

    task_id: str
    task_type: str
    uid: str  # the parent's GRPO group
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    logprobs: list[float]  # what the failing turn was sampled with; 0.0 where mask 0
    error_messages: list[str]
    error_types: list[str]
    tool_position: str  # "turn_N": the failing assistant turn, 1-based
    assistant_turns: int
    user_turns: int
    tool_calls: list[ToolCall]
    attempt: int  # 0 for the first failure of that turn, 1 for its first retry, ...


@dataclass
class RollbackStats:
    """Per episode. Rolled-back calls stay in the episode's ``tool_calls``/``tool_errors`` (the
    policy made them); ``discarded_*`` says how many of those are not in the final transcript."""

    rollbacks: int = 0  # turns rolled back at least once
    retries: int = 0  # re-sampled attempts
    recovered: int = 0  # rolled-back turns whose last attempt ran tools that all succeeded
    discarded_calls: int = 0
    discarded_errors: int = 0


@dataclass(frozen=True)
class Checkpoint:
    """The agent before an assistant turn; the episode's lists only grow, so lengths suffice."""

    response_len: int
    num_turns: int
    messages_len: int
    stream_text: str
    env_state: Any


def _error_type(r: ToolResult) -> str:
    if r.is_error and r.error_type:
        return r.error_type
    m = _EXCEPTION_NAME.search(r.text)
    return m.group(1) if m else "json_error" if r.text.lstrip()[:1] in ("{", "[") else "pattern"


def negative_sample(
    ep: Episode,
    cp: Checkpoint,
    calls: Sequence[ToolCall],
    failed: Sequence[ToolResult],
    attempt: int,
) -> NegativeSample:
    """The failed attempt as it stands right after its tool call ran (before the results are
    appended): pure, reads the episode only."""
    n = cp.response_len
    turn = slice(n, len(ep.response_ids))
    return NegativeSample(
        task_id=ep.task_id,
        task_type=ep.task_type,
        uid=ep.uid,
        prompt_ids=list(ep.prompt_ids),
        response_ids=list(ep.response_ids),
        response_mask=[0] * n + list(ep.response_mask[turn]),
        logprobs=[0.0] * n + list(ep.logprobs[turn]),
        error_messages=[r.text for r in failed],
        error_types=[_error_type(r) for r in failed],
        tool_position=f"turn_{ep.num_turns}",
        assistant_turns=ep.num_turns,
        user_turns=sum(m.get("role") == "user" for m in ep.messages),
        tool_calls=list(calls),
        attempt=attempt,
    )


class TurnGuard:
    """The episode loop's hook: ``begin_turn`` before each assistant turn, ``after_tools`` once
    its calls ran (returns the stream text to resume from when it rolled back), ``finish`` at
    the end. Stats and negatives go onto the episode."""

    def __init__(self, policy: RollbackPolicy, budget: NegativeBudget | None) -> None:
        self.policy = policy
        self.budget = budget
        self._cp: Checkpoint | None = None
        self._attempts = 0  # rollbacks of the current turn
        self._ok = False  # the current attempt ran tools and all of them succeeded
        self._rewound = False

    async def begin_turn(self, ep: Episode, env: Env, stream_text: str) -> None:
        if not self._rewound:  # a new turn: settle the last one, then checkpoint
            self._settle(ep)
            state = await env.asnapshot()
            self._cp = Checkpoint(
                len(ep.response_ids), ep.num_turns, len(ep.messages), stream_text, state
            )
        self._rewound, self._ok = False, False

    async def after_tools(
        self, ep: Episode, env: Env, calls: Sequence[ToolCall], results: Sequence[ToolResult]
    ) -> str | None:
        failed = self.policy.failures(results)
        self._ok = bool(results) and not failed and not any(r.is_error for r in results)
        cp = self._cp
        if not failed or cp is None or env.fatal_error or self._attempts >= self.policy.max_retries:
            return None
        if self.policy.save_negatives and (self.budget is None or self.budget.take()):
            ep.negatives.append(negative_sample(ep, cp, calls, failed, self._attempts))
        ep.rollback.discarded_calls += len(results)
        ep.rollback.discarded_errors += sum(r.is_error for r in results)
        await env.arestore(cp.env_state)
        rewind(ep, cp)
        ep.rollback.rollbacks += int(self._attempts == 0)
        ep.rollback.retries += 1
        self._attempts += 1
        self._rewound = True
        return cp.stream_text

    def finish(self, ep: Episode) -> None:
        self._settle(ep)

    def _settle(self, ep: Episode) -> None:
        """Recovered: the turn was rolled back and its last attempt ran at least one tool call,
        none of whose results is an error (of any type) or a failure by the patterns. A retry
        that calls no tool, or one ended by the environment, did not recover."""
        if self._attempts and self._ok:
            ep.rollback.recovered += 1
        self._attempts, self._ok, self._cp = 0, False, None


def rewind(ep: Episode, cp: Checkpoint) -> None:
    """Cut the episode back to the checkpoint (``ep.messages`` is the loop's own list)."""
    n = cp.response_len
    del ep.response_ids[n:], ep.response_mask[n:], ep.logprobs[n:]
    del ep.messages[cp.messages_len :]
    ep.num_turns = cp.num_turns


def make_guard(
    env: Env, task_type: str, policy: RollbackPolicy | None, budget: NegativeBudget | None
) -> TurnGuard | None:
    """The episode's guard, after ``reset`` (when a remote environment knows if it can
    snapshot); ``None`` when rollback is off or the environment never runs a tool."""
    if policy is None or env.single_turn:
        return None
    if not env.supports_snapshot:
        raise SnapshotUnsupported(unsupported_message(task_type, env))
    return TurnGuard(policy, budget)


def check_snapshot_support(router: EnvRouter, tasks: Sequence[Task]) -> None:
    """At startup: every task type that runs tools must have an environment that can snapshot.
    One environment per type is built (not reset); a type that only learns at reset whether it
    can (a remote one) is checked then, by ``make_guard``."""
    seen: dict[str, Task] = {}
    for t in tasks:
        seen.setdefault(t.task_type, t)
    for task_type, task in sorted(seen.items()):
        env = router.make(task)
        if env.single_turn or env.supports_snapshot or env.snapshot_known_at_reset:
            continue
        raise SnapshotUnsupported(unsupported_message(task_type, env, router.spec(task_type).type))


class NegativeRewardTooHigh(EnvConfigError):
    """``negative_reward`` above the worst score an environment gives: a rolled-back attempt
    would be ranked above a real failure."""


def check_negative_reward(router: EnvRouter, tasks: Sequence[Task], negative_reward: float) -> None:
    """At startup, when negatives are kept: per task type that runs tools, ``negative_reward``
    must not exceed the lowest score of the environment's declared ``reward_range``. Types whose
    range is unknown (None) are not checked; their negatives' advantages are still clamped <= 0.
    An environment that fails to build is skipped here (the episode loop reports it)."""
    by_type: dict[str, list[Task]] = {}
    for t in tasks:
        by_type.setdefault(t.task_type, []).append(t)
    for task_type, group in sorted(by_type.items()):
        env = _first_env(router, group)
        if env is None or env.single_turn or env.reward_range is None:
            continue
        low = float(env.reward_range[0])
        if negative_reward > low:
            raise NegativeRewardTooHigh(
                f"actor_rollout_ref.rollout.multi_turn.negative_reward={negative_reward:g} is "
                f"above the lowest reward ({low:g}) of task type {task_type!r} "
                f"({type(env).__name__}, rewards in [{low:g}, {env.reward_range[1]:g}]): a failed "
                f"attempt would outrank a real failure; set negative_reward <= {low:g}"
            )


def _first_env(router: EnvRouter, tasks: Sequence[Task]) -> Env | None:
    for task in tasks:
        try:
            return router.make(task)
        except Exception:  # a bad row: the next one of its type tells us the range
            continue
    return None


def unsupported_message(task_type: str, env: Env, env_type: str = "") -> str:
    kind = (
        f"environment type {env_type!r} ({type(env).__name__})" if env_type else type(env).__name__
    )
    return (
        "actor_rollout_ref.rollout.multi_turn.enable_tool_rollback needs environments that can "
        f"snapshot their state, but task type {task_type!r} uses {kind}, which cannot; turn "
        "rollback off or leave that task type out of data.train_files"
    )
