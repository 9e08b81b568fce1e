"""Environment types by name, and the router that maps a task's ``task_type`` to one.

Config (``actor_rollout_ref.rollout.multi_turn.envs``), one entry per task type::

    calculator: {max_turns: 4}
    search:     {max_turns: 4, top_k: 3}
    my_remote:  {type: remote, url: "ws://127.0.0.1:8900", max_turns: 6}

``type`` defaults to the task type's own name (built in, or registered by a user's module via
``--import``, ``trainer.imports`` or a ``toolgrpo.envs`` entry point: ``envs/plugins.py``);
``max_concurrency`` caps the task type's environments open at once (``envs/concurrency.py``;
when not given, the type's own default: 32 for MCP stdio servers, none for others; null = no
cap); every other key except ``max_turns`` is passed to the environment's factory as an
option. A factory with a ``validate_options(options)`` attribute has its options checked when the
router is built (at startup, not per episode).
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env
from toolgrpo.envs.concurrency import EnvSlots, hold_slot

EnvFactory = Callable[[Task, Mapping[str, Any]], Env]
EnvHook = Callable[[Task, Env], Env]

_REGISTRY: dict[str, EnvFactory] = {}
# Built-in environment types and the modules that register them (imported on first use, so a
# missing optional dependency only matters to the task types that need it).
_BUILTIN = {
    "rlla": "toolgrpo.envs.rlla",
    "calculator": "toolgrpo.envs.calculator",
    "search": "toolgrpo.envs.search",
    "direct": "toolgrpo.envs.direct",
    "arith_mixed": "toolgrpo.envs.arith_mixed",
    "bfcl_multi_turn": "toolgrpo.envs.bfcl",
    "schemas": "toolgrpo.envs.schemas",  # calls to generated functions, judged not run
    "schemas_rlla": "toolgrpo.envs.schemas",
    "remote": "toolgrpo.envs.remote",
    "mcp": "toolgrpo.envs.mcp",  # needs the extra toolgrpo[mcp]
    "openenv": "toolgrpo.envs.openenv",  # needs the extra toolgrpo[openenv]
    "reasoning_gym": "toolgrpo.envs.reasoning_gym",  # needs the extra toolgrpo[reasoning-gym]
    "verifiers": "toolgrpo.envs.verifiers_env",  # needs the extra toolgrpo[verifiers]
}


class EnvConfigError(ValueError):
    """An environment entry in the config is unusable (unknown type, bad option)."""


def register_env(name: str) -> Callable[[EnvFactory], EnvFactory]:
    def deco(factory: EnvFactory) -> EnvFactory:
        _REGISTRY[name] = factory
        return factory

    return deco


def env_types() -> list[str]:
    return sorted(set(_REGISTRY) | set(_BUILTIN))


def get_env_factory(name: str) -> EnvFactory:
    if name not in _REGISTRY and name in _BUILTIN:
        importlib.import_module(_BUILTIN[name])
    if name not in _REGISTRY:  # installed packages' entry points (toolgrpo.envs.plugins)
        from toolgrpo.envs.plugins import load_entry_points

        load_entry_points()
    if name not in _REGISTRY:
        raise EnvConfigError(f"unknown environment type {name!r}; known: {', '.join(env_types())}")
    return _REGISTRY[name]


@dataclass(frozen=True)
class EnvSpec:
    type: str
    max_turns: int
    options: dict[str, Any] = field(default_factory=dict)
    max_concurrency: int | None = None  # environments of this task type open at once; None = any


# Task types that need no config entry: their defaults.
DEFAULT_SPECS = {
    "rlla": EnvSpec("rlla", 1),
    "calculator": EnvSpec("calculator", 4),
    "search": EnvSpec("search", 4),
    "direct": EnvSpec("direct", 2),  # no tools: one answer (a second turn after a stray call)
    "arith_mixed": EnvSpec("arith_mixed", 4),
    "schemas": EnvSpec("schemas", 1),  # one answer: its calls are judged, not run
    "schemas_rlla": EnvSpec("schemas_rlla", 1),
    # Up to 8 user turns, each needing a call turn and an answer turn.
    "bfcl_multi_turn": EnvSpec("bfcl_multi_turn", 20),
    "reasoning_gym": EnvSpec("reasoning_gym", 4),
    "verifiers": EnvSpec("verifiers", 10),  # verifiers' ToolEnv default; SingleTurnEnv plays 1
}


class EnvRouter:
    """``task_type`` → a fresh environment for one episode, with that type's ``max_turns``."""

    def __init__(self, specs: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.specs: dict[str, EnvSpec] = dict(DEFAULT_SPECS)
        self._slots: dict[str, EnvSlots] = {}
        self._hook: EnvHook | None = None
        for task_type, raw in (specs or {}).items():
            opts = dict(raw or {})
            env_type = str(opts.pop("type", task_type))
            max_turns = int(
                opts.pop("max_turns", DEFAULT_SPECS.get(env_type, EnvSpec("", 4)).max_turns)
            )
            if max_turns < 1:
                raise EnvConfigError(f"envs.{task_type}.max_turns must be >= 1, got {max_turns}")
            factory = get_env_factory(env_type)  # fail at startup, not mid-run
            cap = _max_concurrency(task_type, opts.pop("max_concurrency", _UNSET), factory, opts)
            validate = getattr(factory, "validate_options", None)
            if validate is not None:
                validate(opts)
            self.specs[task_type] = EnvSpec(env_type, max_turns, opts, cap)
            if cap is not None:
                self._slots[task_type] = EnvSlots(cap)

    def spec(self, task_type: str) -> EnvSpec:
        if task_type not in self.specs and task_type not in _BUILTIN:
            self._adopt(task_type)
        if task_type not in self.specs:
            raise EnvConfigError(
                f"no environment for task_type {task_type!r}; configure "
                f"actor_rollout_ref.rollout.multi_turn.envs.{task_type} (known: "
                f"{', '.join(sorted(self.specs))})"
            )
        return self.specs[task_type]

    def _adopt(self, task_type: str) -> None:
        """A user's env type (a plugin's ``@register_env``) plays its own task type unconfigured."""
        if task_type not in _REGISTRY:
            from toolgrpo.envs.plugins import load_entry_points

            load_entry_points()
        factory = _REGISTRY.get(task_type)
        if factory is None:
            return
        validate = getattr(factory, "validate_options", None)
        if validate is not None:
            validate({})
        self.specs[task_type] = EnvSpec(task_type, 4)

    def check(self, task_types: set[str]) -> None:
        """Raise for any task type without an environment (call once on the dataset)."""
        for t in sorted(task_types):
            get_env_factory(self.spec(t).type)

    def make(self, task: Task) -> Env:
        """A fresh environment; under ``max_concurrency`` its reset waits for a free slot."""
        spec = self.spec(task.task_type)
        env = get_env_factory(spec.type)(task, spec.options)
        env.max_turns = spec.max_turns
        slots = self._slots.get(task.task_type)
        env = env if slots is None else hold_slot(env, slots)
        return env if self._hook is None else self._hook(task, env)

    def with_hook(self, hook: EnvHook) -> EnvRouter:
        """This router (its specs and concurrency slots shared) with ``hook(task, env)`` applied
        to every environment it makes: training's schema augmentation (``envs.schema_augment``)."""
        twin = copy.copy(self)
        twin._hook = hook
        return twin


_UNSET = object()


def _max_concurrency(
    task_type: str, value: Any, factory: Any = None, options: Mapping[str, Any] | None = None
) -> int | None:
    """The configured cap; when none is given, the env type's own default
    (``default_max_concurrency(options)`` on its factory, e.g. MCP's stdio servers); an
    explicit null lifts any cap."""
    if value is _UNSET:
        default = getattr(factory, "default_max_concurrency", None)
        return default(options or {}) if default is not None else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EnvConfigError(
            f"envs.{task_type}.max_concurrency must be an integer >= 1 or null, got {value!r}"
        )
    return value
