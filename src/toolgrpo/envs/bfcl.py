"""BFCL multi-turn as a training environment: BFCL's own stateful simulators (file system, trading,
travel, ...) answer the calls, and the reward replays the ground truth on a separate set of them.

Reward. After every user turn the turn is checked the way BFCL's multi-turn checker does: the
model's simulators must equal the ground truth's attribute by attribute (BFCL's ``state_checker``)
and the ground truth's results must appear among the model's results so far (``response_checker``);
a turn with ground-truth calls needs at least one call. A turn whose ground truth is empty
(miss_param / miss_func) passes only if the model made no call in it: BFCL's irrelevance check,
which its current runner skips, applied here so doing nothing is not rewarded by default. Held-back
(miss_func) functions are refused until revealed; BFCL would run them if the model guessed them.
``score`` is the fraction of turns passed *in order*, counting from the first: BFCL stops at the
first failed turn, and a later turn built on a wrong state is not evidence of skill, so only the
passing prefix earns credit; 1.0 means BFCL would mark the entry correct. Turns never reached
(cut off by ``max_turns``) fail. Parts: ``turns_passed`` (= score), ``state_match`` (final state
equals the ground truth's after all turns) and ``turns_completed`` (turns closed by an answer).

The simulators are sync Python: every piece of work on them (building, the model's calls, the
ground truth's replays, scoring) runs in a thread off the event loop, so a simulator that never
returns cannot block the other episodes, and the episode loop's deadline ends the episode.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.envs._bfcl_calls import (
    call_text,
    make_instances,
    method_owners,
    run_ground_truth,
    states_equal,
    turn_passes,
)
from toolgrpo.envs._bfcl_data import BfclEntry, entry_from_task, function_specs
from toolgrpo.envs.base import Env, EnvReward, EnvStart, Transcript, off_loop
from toolgrpo.envs.registry import EnvConfigError, register_env
from toolgrpo.tools.schema import in_thread
from toolgrpo.tools.types import ToolCall, ToolResult


@dataclass(frozen=True)
class BfclOptions:
    # Seconds per call. The simulators are pure Python and fast; a call that times out ends the
    # episode as an environment failure (the one timeout rule), and its thread, which cannot be
    # stopped, finishes in the background.
    call_timeout: float = 10.0

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> BfclOptions:
        known = {f.name for f in fields(cls)}
        unknown = set(options) - known
        if unknown:
            raise EnvConfigError(f"bfcl_multi_turn: unknown options {sorted(unknown)}")
        return cls(**dict(options))


@dataclass
class _State:
    """Everything that changes during an episode: a deep copy of it is a snapshot."""

    instances: dict[str, Any]  # the model's simulators, by class name
    truth: dict[str, Any]  # the ground truth's simulators, advanced turn by turn
    shown: set[str]  # function names the model may call now
    turn: int = 0  # index of the current user turn
    results: list[str] = field(default_factory=list)  # every result so far (response check)
    turn_calls: int = 0  # calls made in the current turn
    passed: list[bool] = field(default_factory=list)  # one per checked turn
    closed: int = 0  # turns the model ended with an answer
    finished: bool = False


class BfclEnv(Env):
    supports_snapshot = True
    reward_range = (0.0, 1.0)  # the fraction of turns passed in order
    needs_ground_truth_at_reset = True  # the reference calls run turn by turn beside the model's

    def __init__(self, task: Task, options: BfclOptions | None = None) -> None:
        self.task = task
        self.entry: BfclEntry = entry_from_task(task)
        self.options = options or BfclOptions()
        self.max_turns = 16  # the router sets its configured value after construction
        self._shown_specs, self._later_specs = function_specs(self.entry)
        self._state: _State | None = None
        self._owners: dict[str, str] = {}

    @property
    def num_turns(self) -> int:
        return len(self.entry.ground_truth)

    async def reset(self) -> EnvStart:
        return await off_loop(self._reset)

    def _reset(self) -> EnvStart:
        self._state = _State(
            instances=make_instances(self.entry),
            truth=make_instances(self.entry),
            shown={s["function"]["name"] for s in self._shown_specs},
        )
        self._owners = method_owners(self._state.instances)
        return EnvStart(
            messages=[dict(m) for m in self.task.messages],
            tools=copy.deepcopy(self._shown_specs),
        )

    # ---- tool calls ----------------------------------------------------------------------------

    async def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        """Calls run one after another, not in parallel: the simulators are stateful (``cd`` then
        ``ls``), and BFCL runs a turn's calls in order too."""
        results = []
        for call in calls:
            try:
                result = await self._call(call)
            except Exception as e:  # a bug here must not take the rollout down
                result = _error(call, "exception", f"Error during execution: {e}")
            results.append(result)
        return results

    async def _call(self, call: ToolCall) -> ToolResult:
        s = self._require_state()
        if call.parse_error is not None or not call.name:
            return _error(call, "parse", f"Could not parse the tool call: {call.parse_error}")
        s.turn_calls += 1
        owner = self._owners.get(call.name)
        if owner is None or call.name not in s.shown:
            s.results.append(f"Error during execution: no function named {call.name!r}")
            return _error(call, "unknown_tool", s.results[-1])
        method = getattr(s.instances[owner], call.name)
        args = copy.deepcopy(call.arguments)
        try:
            if not isinstance(args, dict):
                raise TypeError(f"arguments must be a JSON object, got {type(args).__name__}")
            inspect.signature(method).bind(**args)
        except TypeError as e:
            s.results.append(f"Error during execution: {e}")
            return _error(call, "invalid_arguments", f"Invalid arguments for {call.name}: {e}")
        try:
            # A thread of its own: asyncio.run would wait for a timed-out call in its executor
            value = await asyncio.wait_for(
                in_thread(method, args, call.name), self.options.call_timeout
            )
        except asyncio.TimeoutError:
            s.results.append("Error during execution: timed out")
            return _error(call, "timeout", f"{call.name} timed out")
        except Exception as e:
            s.results.append(f"Error during execution: {e}")
            return _error(call, "exception", s.results[-1])
        s.results.append(call_text(value))  # long results are cut by the rollout, not here
        return ToolResult(text=s.results[-1], name=call.name, call_id=call.id)

    # ---- turns and reward ----------------------------------------------------------------------

    async def next_user_turn(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        return await off_loop(self._next_user_turn)  # the ground truth's turn runs in a thread

    def _next_user_turn(self) -> list[dict[str, Any]] | None:
        s = self._require_state()
        if s.finished:
            return None
        self._check_turn(s)
        s.closed += 1
        s.turn += 1
        s.turn_calls = 0
        if s.turn >= self.num_turns:
            s.finished = True
            return None
        if s.turn in self._later_specs:  # miss_func: the held-back functions arrive now
            return [{"role": "user", "content": self._reveal(s, self._later_specs[s.turn])}]
        return [dict(m) for m in self.entry.turns[s.turn]]

    def _reveal(self, s: _State, specs: list[dict[str, Any]]) -> str:
        from bfcl_eval.constants.default_prompts import (
            DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING as prompt,
        )

        s.shown |= {spec["function"]["name"] for spec in specs}
        return prompt.format(functions="\n".join(json.dumps(spec) for spec in specs))

    def _check_turn(self, s: _State) -> None:
        """Advance the ground truth through the current turn and record whether the turn passed."""
        truth_calls = self.entry.ground_truth[s.turn]
        truth_results = run_ground_truth(s.truth, truth_calls)
        s.passed.append(
            turn_passes(s.instances, s.truth, s.turn_calls, s.results, truth_calls, truth_results)
        )

    async def reward(self, transcript: Transcript) -> EnvReward:
        """Scores from the state the environment tracked (see the module docstring); the
        transcript's text is not needed."""
        return await off_loop(self._reward)

    def _reward(self) -> EnvReward:
        s = copy.deepcopy(self._require_state())  # scoring must not disturb the episode
        if not s.finished and len(s.passed) == s.turn:  # the turn in progress when it was cut off
            self._check_turn(s)
        for turn in range(len(s.passed), self.num_turns):  # never reached: the truth still moves on
            run_ground_truth(s.truth, self.entry.ground_truth[turn])
        prefix = 0
        for ok in s.passed:
            if not ok:
                break
            prefix += 1
        score = prefix / self.num_turns
        state_match = float(states_equal(s.instances, s.truth))
        return EnvReward(
            score=score,
            parts={
                "turns_passed": score,
                "state_match": state_match,
                "turns_completed": s.closed / self.num_turns,
            },
        )

    # ---- rollback ------------------------------------------------------------------------------

    def snapshot(self) -> _State:
        return copy.deepcopy(self._require_state())

    def restore(self, state: Any) -> None:
        self._state = copy.deepcopy(state)

    def _require_state(self) -> _State:
        if self._state is None:
            raise RuntimeError("BfclEnv: call reset() first")
        return self._state


def _error(call: ToolCall, error_type: str, text: str) -> ToolResult:
    return ToolResult(
        text=text, is_error=True, error_type=error_type, name=call.name, call_id=call.id
    )


@register_env("bfcl_multi_turn")
def make_bfcl_env(task: Task, options: Mapping[str, Any]) -> BfclEnv:
    return BfclEnv(task, BfclOptions.from_mapping(options))


make_bfcl_env.needs_ground_truth_at_reset = True  # type: ignore[attr-defined]  # for serve-env
