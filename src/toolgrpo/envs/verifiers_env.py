"""verifiers environments (prime-rl's ``verifiers``, its classic API, tested with 0.2.1 and
0.3.1; extra ``toolgrpo[verifiers]``) played as toolgrpo episodes.

A data source ``verifiers:<env id>[:train|eval][?<load_environment argument>=value&...]`` loads
an installed environment with ``verifiers.load_environment`` (its module's ``load_environment``);
each dataset row becomes a task of type ``verifiers``. The environment type ``verifiers`` plays
it: the row's prompt opens the episode, the environment's tools (``ToolEnv``) are the episode's
tools, and its rubric, with its parser, scores the finished episode.

toolgrpo samples from its own policy: verifiers' clients, rollout loop and servers are never
used, so nothing here needs a network or an OpenAI client. What cannot be played that way is
refused when the source is loaded, naming the reason (``check_supported``).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import json
import logging
import math
import os
import signal
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from toolgrpo.data.source_spec import parse_source_spec
from toolgrpo.data.task import Task
from toolgrpo.envs.base import EnvReward, Transcript
from toolgrpo.envs.registry import EnvConfigError, register_env
from toolgrpo.envs.tool_env import ToolEnv
from toolgrpo.errors import DataError
from toolgrpo.tools.schema import Tool, dict_tool

KIND = "verifiers"
SPLITS = ("train", "eval")
OPTIONS = ("timeout_s",)
# Stop conditions of MultiTurnEnv and ToolEnv themselves; the episode loop covers them (an answer
# without a tool call, max_turns, the token budget). Any other is the environment's own logic.
_BUILTIN_STOPS = {
    "has_error",
    "prompt_too_long",
    "max_turns_reached",
    "max_total_completion_tokens_reached",
    "has_final_env_response",
    "no_tools_called",
}
# Methods a supported environment must leave as its base class has them.
_FIXED = ("env_response", "setup_state", "get_prompt_messages", "render_completion", "call_tool")
_TRUNCATED = {"context", "length", "max_turns", "prompt_too_long"}

_LOCK = threading.Lock()
_ENVS: dict[tuple[str, str], Any] = {}


def _vf() -> Any:
    try:
        import verifiers as vf

        for name in ("Environment", "MultiTurnEnv", "SingleTurnEnv", "ToolEnv", "load_environment"):
            getattr(vf, name)
        vf_log = logging.getLogger("verifiers")
        if not os.environ.get("VF_LOG_LEVEL") and not vf_log.handlers:
            # verifiers drops its records unless VF_LOG_LEVEL is set; here they join toolgrpo's
            # (run.log; errors such as a failing reward function also reach the console)
            vf_log.propagate = True
    except ImportError as e:
        raise DataError(
            "verifiers: data sources need the verifiers package "
            "(pip install 'toolgrpo[verifiers]'; see scripts/setup.sh)"
        ) from e
    except AttributeError as e:
        raise DataError(
            f"the installed verifiers has no classic environment API ({e}); toolgrpo plays "
            "environments of the classic API (vf.SingleTurnEnv, vf.ToolEnv: verifiers 0.2.1-0.3.1)"
        ) from e
    return vf


def load_vf_env(env_id: str, args_json: str = "{}") -> Any:
    """The loaded environment, once per process and arguments (loading builds its dataset)."""
    key = (env_id, args_json)
    with _LOCK:
        if key not in _ENVS:
            _ENVS[key] = _load(env_id, json.loads(args_json))
        return _ENVS[key]


def _load(env_id: str, args: dict[str, Any]) -> Any:
    vf = _vf()
    # verifiers' Environment installs SIGINT/SIGTERM handlers of its own (and fails outside the
    # main thread): toolgrpo keeps its handlers, so registration is skipped while it loads.
    _quiet_datasets()
    install = signal.signal
    signal.signal = lambda *a, **k: None  # type: ignore[assignment]
    try:
        env = vf.load_environment(env_id, **args)
    except Exception as e:
        hint = (
            " (install the environment's package, or name its module file with --import)"
            if isinstance(e.__cause__, ImportError)
            else ""
        )
        raise DataError(f"cannot load verifiers environment {env_id!r}: {_why(e)}{hint}") from e
    finally:
        signal.signal = install  # type: ignore[assignment]
    check_supported(env, env_id)
    return env


def _quiet_datasets() -> None:
    """No progress bar per ``Dataset.map`` on the console (toolgrpo's console stays quiet)."""
    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:  # an environment without HF datasets: nothing to silence
        pass


def check_supported(env: Any, env_id: str) -> None:
    """Refuse, with every reason, an environment whose behaviour lives in verifiers' own rollout
    loop or needs a model client: only then is playing it here the same as playing it there."""
    vf = _vf()
    cls = type(env).__name__
    problems = []
    if not isinstance(env, vf.MultiTurnEnv):
        problems.append(f"{cls} runs a rollout loop of its own (EnvGroup, custom Environment)")
    elif isinstance(env, vf.StatefulToolEnv):
        problems.append("StatefulToolEnv fills tool arguments from rollout state")
    elif not isinstance(env, (vf.ToolEnv, vf.SingleTurnEnv)):
        problems.append("a MultiTurnEnv answers the model with its own env_response")
    else:
        base = vf.ToolEnv if isinstance(env, vf.ToolEnv) else vf.SingleTurnEnv
        problems += [
            f"it overrides {m}"
            for m in _FIXED
            if getattr(type(env), m, None) is not getattr(base, m, None)
        ]
        stops = sorted({s.__name__ for s in env._stop_conditions} - _BUILTIN_STOPS)
        if stops:
            problems.append(f"it has stop conditions of its own ({', '.join(stops)})")
    if getattr(env, "message_type", "chat") != "chat":
        problems.append(f"message_type {env.message_type!r} (chat only)")
    rubrics = list(getattr(env.rubric, "rubrics", [env.rubric]))
    if env.rubric.has_group_rewards:
        problems.append("its rubric has group reward functions (they score rollouts together)")
    if any(isinstance(r, vf.JudgeRubric) for r in rubrics):
        problems.append("a JudgeRubric asks an LLM judge through an API client")
    if not any(w for r in rubrics for w in r._get_reward_weights()):
        problems.append("its rubric has no weighted reward function (every score would be 0)")
    if problems:
        raise DataError(
            f"verifiers environment {env_id!r} ({cls}) cannot be played by toolgrpo: "
            f"{'; '.join(problems)}. Supported: SingleTurnEnv and ToolEnv environments whose "
            "rubric scores each rollout alone without a model client"
        )


def _dataset(env: Any, split: str, env_id: str) -> Any:
    try:
        return env.get_dataset() if split == "train" else env.get_eval_dataset()
    except Exception as e:
        raise DataError(
            f"verifiers environment {env_id!r} has no {split} dataset: {_why(e)}"
        ) from e


def verifiers_tasks(spec: str) -> list[Task | Exception]:
    """A source's dataset rows as tasks of type ``verifiers`` (a bad row is its error)."""
    s = parse_source_spec(spec, KIND, SPLITS)
    args_json = json.dumps(s.args, sort_keys=True)
    env = load_vf_env(s.name, args_json)
    ref = {"env_id": s.name, "args": args_json, "split": s.split}
    out: list[Task | Exception] = []
    for i, row in enumerate(_dataset(env, s.split, s.name)):
        try:
            out.append(_row_task(row, i, s.label(), {**ref, "index": i}))
        except ValueError as e:
            out.append(e)
    return out


def _row_task(row: Mapping[str, Any], i: int, label: str, ref: dict[str, Any]) -> Task:
    prompt = row.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        raise ValueError("'prompt' must be a non-empty list of messages")
    messages = []
    for m in prompt:
        if not isinstance(m, Mapping) or not isinstance(m.get("content"), str):
            raise ValueError("each prompt message needs a text 'content' (no content parts)")
        if m.get("role") not in ("system", "user", "assistant"):
            raise ValueError(f"prompt message role {m.get('role')!r} is not system/user/assistant")
        messages.append({"role": str(m["role"]), "content": m["content"]})
    info = _info(row)
    if "tool_defs" in info:
        raise ValueError("per-row info.tool_defs are not supported (the environment's tools are)")
    answer = row.get("answer")
    answer = answer if isinstance(answer, str) else "" if answer is None else json.dumps(answer)
    return Task(
        task_id=f"{label}#{row.get('example_id', i)}",
        messages=tuple(messages),
        ground_truth=answer,
        data_source=f"{KIND}:{ref['env_id']}",
        task_type=KIND,
        meta={"index": i, "split": ref["split"], "row": i, KIND: ref},
    )


def _info(row: Mapping[str, Any]) -> dict[str, Any]:
    info = row.get("info") or {}
    if isinstance(info, str):
        try:
            info = json.loads(info)
        except json.JSONDecodeError as e:
            raise ValueError(f"'info' is text that is not JSON ({e})") from None
    if not isinstance(info, dict):
        raise ValueError(f"'info' must be an object, got {type(info).__name__}")
    return info


@functools.lru_cache(maxsize=16)
def _tools(env: Any) -> tuple[Tool, ...]:
    """The environment's tools as toolgrpo tools (schema checked, run with deadlines)."""
    tool_map = getattr(env, "tool_map", {})
    out = []
    for d in env.tool_defs or []:
        if d.name not in tool_map:
            raise EnvConfigError(f"verifiers tool {d.name!r} has a definition but no function")
        spec = {"name": d.name, "description": d.description, "parameters": d.parameters}
        out.append(dict_tool(spec, _as_text(tool_map[d.name])))
    return tuple(out)


def _as_text(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The tool as ToolEnv.call_tool reads its result: text parts joined, anything else str()."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def call_async(**kwargs: Any) -> str:
            return _text(await fn(**kwargs))

        return call_async

    @functools.wraps(fn)
    def call(**kwargs: Any) -> str:
        return _text(fn(**kwargs))

    return call


def _text(value: Any) -> str:
    if isinstance(value, list) and value and all(isinstance(p, dict) for p in value):
        texts = [p.get("text") for p in value]
        if all(isinstance(t, str) for t in texts):
            return "\n".join(texts)
    return value if isinstance(value, str) else str(value)


def _vf_message(m: Mapping[str, Any]) -> dict[str, Any]:
    """A transcript message as verifiers' message types take it."""
    out: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
    if m["role"] == "assistant" and m.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c.get("id", ""), "name": c["function"]["name"], **_args(c["function"])}
            for c in m["tool_calls"]
        ]
    if m["role"] == "tool":
        out["tool_call_id"] = str(m.get("tool_call_id") or "")
    return out


def _args(function: Mapping[str, Any]) -> dict[str, str]:
    args = function.get("arguments", "{}")
    return {"arguments": args if isinstance(args, str) else json.dumps(args)}


async def _score(env: Any, row: Mapping[str, Any], transcript: Transcript, n: int) -> EnvReward:
    """The rubric's score, on a verifiers State built as its own rollout would leave it."""
    from verifiers.types import RolloutTiming, State, flatten_task_input
    from verifiers.utils.message_utils import normalize_messages

    row = copy.deepcopy(dict(row))
    row["info"] = _info(row)
    task = flatten_task_input(row)
    state = State(input=task)
    state["task"] = task
    state["prompt"] = normalize_messages(row["prompt"], field_name="prompt")
    msgs = transcript.messages
    if n and msgs and msgs[0].get("role") == "system" and row["prompt"][0].get("role") != "system":
        n += 1  # the episode put the tool specs in a system message of its own (render.with_tools)
    completion = normalize_messages([_vf_message(m) for m in msgs[n:]], field_name="completion")
    tid = uuid.uuid4().hex
    state.update(
        completion=completion,
        trajectory=[_step(m, tid) for m in completion if m.role == "assistant"],
        tool_defs=list(env.tool_defs or []),
        is_completed=True,
        is_truncated=transcript.stop_reason in _TRUNCATED,
        stop_condition=transcript.stop_reason,
        trajectory_id=tid,
        reward=None,
        metrics=None,
        error=None,
        final_env_response=None,
        timing=RolloutTiming(),
    )
    await env.rubric.score_rollout(state)
    await env.rubric.cleanup(state)
    reward = float(state["reward"])
    if not math.isfinite(reward):
        raise ValueError(f"the rubric scored {reward}")
    parts = {str(k): float(v) for k, v in (state.get("metrics") or {}).items()}
    return EnvReward(reward, {k: v for k, v in parts.items() if math.isfinite(v)})


def _step(message: Any, tid: str) -> dict[str, Any]:
    return {
        "prompt": [],
        "completion": [message],
        "response": None,
        "tokens": None,
        "reward": None,
        "advantage": None,
        "is_truncated": False,
        "trajectory_id": tid,
        "extras": {},
    }


def _timeout(options: Mapping[str, Any]) -> float:
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise EnvConfigError(f"unknown verifiers option(s) {unknown}; known: {', '.join(OPTIONS)}")
    value = options.get("timeout_s", 10.0)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise EnvConfigError(f"verifiers option timeout_s must be a number > 0, got {value!r}")
    return float(value)


@register_env(KIND)
def make_verifiers_env(task: Task, options: Mapping[str, Any]) -> ToolEnv:
    """Options: ``timeout_s`` per tool call (default 10)."""
    timeout_s = _timeout(options)
    ref = task.meta.get(KIND)
    if not isinstance(ref, dict):
        raise EnvConfigError(
            f"task {task.task_id!r} of type verifiers has no verifiers source; load it from "
            "data.train_files=[verifiers:<env id>]"
        )
    env = load_vf_env(ref["env_id"], ref["args"])
    row = _dataset(env, ref["split"], ref["env_id"])[int(ref["index"])]
    n = len(task.messages)
    out = ToolEnv(
        task.messages,
        _tools(env),
        lambda t: asyncio.run(_score(env, row, t, n)),  # a thread of its own (ToolEnv.reward)
        timeout_s=timeout_s,
    )
    out.single_turn = isinstance(env, _vf().SingleTurnEnv)
    return out


make_verifiers_env.validate_options = _timeout  # type: ignore[attr-defined]


def _why(e: BaseException) -> str:
    cause = e.__cause__ or e
    text = " ".join(str(cause).split())
    return f"{type(cause).__name__}: {text}" if text else type(cause).__name__
