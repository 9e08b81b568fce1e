"""The environment contract: one instance per episode, async, message-level (never tokens).

``reset`` gives the opening messages and the tool schemas; ``step`` runs a turn's tool calls (in
parallel) and returns the tool messages; ``reward`` scores the finished episode. Environments that
can be rolled back (issue #6) also implement ``snapshot``/``restore``.

An environment that owns its turn (``TextEnv``, SkyRL-gym's ``step(action: str)``) gets the
assistant's text instead of parsed calls, parses its own actions and returns the next messages,
a reward for the step and whether the episode ended (``TextStep``). Any step may return a reward
(``ToolResult.reward``, ``TextStep.reward``): the episode's return is ``reward(transcript).score``
plus the sum of the steps' rewards of its kept trajectory (``Episode.step_rewards``).

The episode loop gives every call a deadline (``rollout.env_calls``): a call past it ends the
episode as an environment failure. The methods run on the event loop and must not block it
(nothing can interrupt a blocked loop, and one that blocks past its deadline fails its episode):
blocking work goes through ``off_loop``, a thread of its own. The episode loop also accepts a
plain ``def`` method and runs it in a thread; the constructor always runs in one.
"""

from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from toolgrpo.tools.schema import in_thread
from toolgrpo.tools.types import ToolCall, ToolResult

if TYPE_CHECKING:
    from toolgrpo.data.task import Task


async def off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` without blocking the event loop: a coroutine function is awaited, a sync
    function runs in a daemon thread of its own, so an episode's deadline can leave a call that
    never returns behind (the thread lingers until it does: Python cannot stop it)."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    value = await in_thread(functools.partial(fn, *args), {}, getattr(fn, "__name__", ""))
    return await value if inspect.isawaitable(value) else value


@dataclass
class EnvStart:
    messages: list[dict[str, Any]]  # system/user messages that open the episode
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI function specs for tools=


@dataclass
class Transcript:
    """A finished (or cut-off) episode as the environment's reward sees it."""

    messages: list[dict[str, Any]]  # opening messages, then assistant/tool turns
    text: str  # decoded prompt + response, special tokens kept (what verl passes to a reward)
    stop_reason: str  # "answer" | "done" | "max_turns" | "context" | "length" | ... (STOP_REASONS)
    num_turns: int
    step: int = 0  # the trainer's global step (for rewards that change over training)


@dataclass
class TextStep:
    """What a text environment's step returns: the messages that follow the action (a tool's or
    a user's; none and not ``done`` also ends the episode), the step's reward, and whether the
    environment ended the episode."""

    observations: list[dict[str, Any]] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False


@dataclass
class EnvReward:
    score: float
    parts: dict[str, float] = field(default_factory=dict)  # logged as reward/<part>


class Env(ABC):
    """Base class; subclasses set ``max_turns`` (assistant turns per episode) at construction."""

    max_turns: int = 1
    single_turn: bool = False  # True: the first assistant turn ends the episode (no tools run)
    # Set by an environment that can no longer serve the episode (e.g. its server died): the
    # episode loop stops it with stop reason "env_error"; the trainer leaves it out of training.
    fatal_error: str | None = None
    # (lowest, highest) score ``reward`` can return, None if unknown. Rollback's negatives must not
    # score above the lowest (EpisodeRunner.check): a failed attempt would outrank a real failure.
    reward_range: tuple[float, float] | None = None
    # Served remotely (toolgrpo serve-env), an environment gets the task's answer only when asked
    # for the reward; one that needs it earlier (to run a reference solution beside the model's
    # calls, say) sets this, on its class or on its factory function.
    needs_ground_truth_at_reset: bool = False
    # True for an environment whose ``step`` takes the assistant's text (``TextEnv``): the loop
    # parses no tool calls for it, and tool rollback leaves it alone.
    owns_turn: bool = False

    @abstractmethod
    async def reset(self) -> EnvStart: ...

    @abstractmethod
    async def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        """Results in call order; never raises (failures are error results)."""

    @abstractmethod
    async def reward(self, transcript: Transcript) -> EnvReward: ...

    async def next_user_turn(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """Called when the model answers without a tool call: further user messages continue the
        episode (multi-turn dialogues such as BFCL's); ``None`` ends it."""
        return None

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (servers, sessions)."""

    def opening_for(self, task: Task, start: EnvStart) -> EnvStart | None:
        """The opening another task of this environment's type would get, derived from this
        environment's own ``start`` without a reset; ``None`` when it cannot be derived. The
        startup prompt measurement resets one environment per task type and asks this for the
        rest, so environments that open a server session each reset override it."""
        return None

    async def openings_for(self, tasks: Sequence[Task]) -> list[EnvStart | None] | None:
        """The openings of ``tasks`` (of this environment's type) in one batch, asked of a fresh
        environment before (instead of) its reset: ``None`` in the list where a task's cannot
        open, ``None`` overall where this environment cannot batch (the startup measurement then
        resets it, and uses ``opening_for``). Remote environments ask their server in one
        session rather than one session per task."""
        return None

    # ---- rollback support (issue #6) ----------------------------------------------------------
    supports_snapshot: bool = False
    # True for environments that only learn at ``reset`` whether they can snapshot (remote ones):
    # the startup check then leaves them to the episode loop.
    snapshot_known_at_reset: bool = False

    def snapshot(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} cannot snapshot its state")

    def restore(self, state: Any) -> None:
        """Back to ``state``; may be called again with the same state (repeated retries, and
        fission's continuations, which restore it into fresh instances of the same task's
        environment after their reset), so it must not hand the state's objects to the
        environment without copying them."""
        raise NotImplementedError(f"{type(self).__name__} cannot restore its state")

    async def asnapshot(self) -> Any:
        """What rollback awaits; remote environments override it (their state lives elsewhere)."""
        return self.snapshot()

    async def arestore(self, state: Any) -> None:
        self.restore(state)


class TextEnv(Env):
    """An environment that owns the turn, as SkyRL-gym's are: ``step`` gets what the model wrote
    (its eos token removed) and parses its own actions; ``reward`` defaults to 0, so the return
    is the sum of the steps' rewards unless the environment also scores the transcript."""

    owns_turn = True

    @abstractmethod
    async def step(self, action: str) -> TextStep:  # type: ignore[override]
        """The turn's outcome; never raises (a bad action is an observation saying so)."""

    async def reward(self, transcript: Transcript) -> EnvReward:
        return EnvReward(0.0)
