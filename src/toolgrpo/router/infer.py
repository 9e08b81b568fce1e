"""Routing one prompt at inference: the checkpoint's head (or a fresh one), its route
probabilities, and the prompt conditioning to play the chosen route with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.envs.base import EnvStart
from toolgrpo.models.safe_load import CorruptCheckpoint, load_torch_file
from toolgrpo.rollout.prompts import render_prompt
from toolgrpo.router.families import FamilyMap, message_tools, read_family_file, spec_tools
from toolgrpo.router.policy import RouterPolicy
from toolgrpo.router.routes import ROUTES, check_name
from toolgrpo.router.runtime import RouteCondition
from toolgrpo.router.spec import SPEC_KEY, families_from_spec

ROUTER_FILE = "router.pt"  # in a checkpoint directory, next to optimizer.pt


@dataclass(frozen=True)
class RouteChoice:
    route: str
    probs: dict[str, float]
    fresh: bool  # an untrained head (uniform probabilities)


def load_router(cfg: Any, lm: Any, checkpoint: str | None) -> tuple[RouterPolicy | None, bool]:
    """The head saved in ``checkpoint`` (its own shape and pooling), else a fresh head when
    ``router.enable`` is set, else None; the flag says whether the head is fresh."""
    path = Path(checkpoint) / ROUTER_FILE if checkpoint else None
    if path is not None and path.is_file():
        state = load_torch_file(path)  # weights-only: a crafted router.pt is refused, not run
        if not isinstance(state, dict) or not isinstance(state.get("meta"), dict):
            raise CorruptCheckpoint(f"{path} lacks the router head's meta")
        meta = state["meta"]
        router = RouterPolicy(lm, meta["routes"], meta["pooling"], meta["head_hidden"], lr=1.0)
        router.load_state_dict(state)
        return router, False
    if not cfg.router.enable:
        return None, False
    rc = cfg.router
    return RouterPolicy(lm, rc.routes, rc.pooling, rc.head_hidden, lr=1.0), True


def choose_route(
    router: RouterPolicy,
    task: Task,
    max_prompt_length: int,
    sample: bool = False,
    force: str | None = None,
    fresh: bool = False,
) -> RouteChoice:
    """The route for ``task``'s original prompt: argmax (or sampled), unless ``force`` names one."""
    ids = render_prompt(router.lm.tokenizer, task.messages, max_prompt_length, "left")
    out = router.forward([ids], sample=sample)
    probs = {r: float(p) for r, p in zip(router.routes, out.probs[0].tolist(), strict=True)}
    route = router.routes[int(out.router_action[0])]
    if force:
        route = check_name(force, ROUTES, "route")
    return RouteChoice(route, probs, fresh)


def conditioner(
    route: str,
    families_file: str = "",
    family_tools_only: bool = False,
    spec: dict[str, Any] | None = None,
) -> Any:
    """The episode's condition for ``route`` (prompt rewrite and refused calls): families from
    the heuristic over the tools the episode opens with, overridden by ``families_file``, or by
    a checkpoint's saved prompt ``spec`` (its families and ``family_tools_only``), so a trained
    head is played with the prompts it was trained with."""
    if spec:
        overrides = dict(families_from_spec(spec).overrides)
        family_tools_only = bool(spec["family_tools_only"])
    else:
        overrides = read_family_file(families_file) if families_file else {}
    return _OpeningCondition(route, FamilyMap(overrides=overrides), family_tools_only)


@dataclass(frozen=True)
class _OpeningCondition(RouteCondition):
    """A ``RouteCondition`` that learns the episode's tools (with their descriptions) from the
    opening it rewrites: ``infer`` has no training tasks to list them from."""

    def __call__(self, start: EnvStart) -> EnvStart:
        self.families.add(message_tools(start.messages) + spec_tools(start.tools))
        return super().__call__(start)


def saved_spec(checkpoint: str | None) -> dict[str, Any] | None:
    """The prompt spec saved in a checkpoint's ``router.pt`` (None: none, or an older file)."""
    path = Path(checkpoint) / ROUTER_FILE if checkpoint else None
    if path is None or not path.is_file():
        return None
    state = load_torch_file(path)
    spec = state.get(SPEC_KEY) if isinstance(state, dict) else None
    return spec if isinstance(spec, dict) else None


def describe(choice: RouteChoice) -> str:
    probs = "  ".join(f"{r} {p:.2f}" for r, p in choice.probs.items())
    note = " (fresh head: untrained, uniform)" if choice.fresh else ""
    return f"route: {choice.route}   [{probs}]{note}"


def route_for_infer(
    cfg: Any,
    lm: Any,
    task: Task,
    checkpoint: str | None,
    sample: bool = False,
    force: str | None = None,
) -> tuple[RouteChoice | None, Any]:
    """``toolgrpo infer``'s routing: the choice (None without a router) and the episode's
    prompt conditioning (None: the prompt as given)."""
    router, fresh = load_router(cfg, lm, checkpoint)
    if router is not None:
        choice = choose_route(router, task, cfg.data.max_prompt_length, sample, force, fresh)
    elif force:
        choice = RouteChoice(check_name(force, ROUTES, "route"), {}, False)
    else:
        return None, None
    rc = cfg.router
    spec = saved_spec(checkpoint)
    return choice, conditioner(choice.route, rc.families_file, rc.family_tools_only, spec)
