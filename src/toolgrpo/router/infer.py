"""Routing one prompt at inference: the checkpoint's head (or a fresh one), its route
probabilities, the route (``router.infer_mode``: by default a threshold on P(tool) calibrated to
keep the budget, ``router.calibrate``) and the prompt conditioning to play it with."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolgrpo.config.router import max_cost
from toolgrpo.data.task import Task
from toolgrpo.envs.base import EnvStart
from toolgrpo.models.safe_load import CorruptCheckpoint, load_torch_file
from toolgrpo.router.calibrate import (
    THRESHOLD_KEY,
    Threshold,
    resolve_infer_mode,
    threshold_route,
    tool_probability,
)
from toolgrpo.router.families import FamilyMap, message_tools, read_family_file, spec_tools
from toolgrpo.router.policy import RouterPolicy
from toolgrpo.router.routes import ANSWER, ROUTES, check_name
from toolgrpo.router.runtime import RouteCondition
from toolgrpo.router.spec import SPEC_KEY, families_from_spec

log = logging.getLogger(__name__)
ROUTER_FILE = "router.pt"  # in a checkpoint directory, next to optimizer.pt


@dataclass(frozen=True)
class RouteChoice:
    route: str
    probs: dict[str, float]
    fresh: bool  # an untrained head (uniform probabilities)
    mode: str = "argmax"  # how the route was chosen: threshold | argmax | sample | forced
    tau: float | None = None  # the threshold applied (mode threshold)


def load_router(cfg: Any, lm: Any, checkpoint: str | None) -> tuple[RouterPolicy | None, bool]:
    """The head saved in ``checkpoint`` (its own shape and pooling), else a fresh head when
    ``router.enable`` is set, else None; the flag says whether the head is fresh."""
    path = Path(checkpoint) / ROUTER_FILE if checkpoint else None
    if path is not None and path.is_file():
        state = load_torch_file(path)  # weights-only: a crafted router.pt is refused, not run
        if not isinstance(state, dict) or not isinstance(state.get("meta"), dict):
            raise CorruptCheckpoint(f"{path} lacks the router head's meta")
        meta = state["meta"]
        router = RouterPolicy(
            lm,
            meta["routes"],
            meta["pooling"],
            meta["head_hidden"],
            lr=1.0,
            feature_layer=int(meta.get("feature_layer", -1)),
            inputs=str(meta.get("inputs", "question")),  # heads before router.inputs read that
            tool_format=str(meta.get("tool_format", "hermes")),  # the openings it was trained on
            feature_norm=str(meta.get("feature_norm", "layer")),  # heads before it: layer
        )
        router.load_state_dict(state)
        router.adopt_average(state)  # the weights validation routed with (router.head_ema)
        return router, False
    if not cfg.router.enable:
        return None, False
    rc = cfg.router
    fresh = RouterPolicy(
        lm,
        rc.routes,
        rc.pooling,
        rc.head_hidden,
        lr=1.0,
        feature_layer=rc.feature_layer,
        inputs=rc.inputs,
        tool_format=cfg.actor_rollout_ref.rollout.multi_turn.format,
        feature_norm=rc.feature_norm,
    )
    return fresh, True


def choose_route(
    router: RouterPolicy,
    task: Task,
    max_prompt_length: int,
    mode: str = "argmax",
    force: str | None = None,
    fresh: bool = False,
    threshold: Threshold | None = None,
) -> RouteChoice:
    """The route for ``task``'s original prompt: ``threshold`` (the top tool route iff
    P(tool) >= ``threshold.tau``, else ANSWER), ``argmax`` or ``sample``, unless ``force``
    names one."""
    if mode == "threshold" and threshold is None:
        raise ValueError("threshold routing needs a calibrated threshold")
    out = router.act(router.features_of([task], max_prompt_length), sample=mode == "sample")
    p = out.probs[0].tolist()
    probs = {r: float(x) for r, x in zip(router.routes, p, strict=True)}
    route = router.routes[int(out.router_action[0])]
    tau = None
    if mode == "threshold":
        assert threshold is not None
        route, tau = threshold_route(p, router.routes, threshold.tau), threshold.tau
    if force:
        return RouteChoice(check_name(force, ROUTES, "route"), probs, fresh, "forced")
    return RouteChoice(route, probs, fresh, mode, tau)


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


def saved_threshold(checkpoint: str | None) -> Threshold | None:
    """The τ saved in a checkpoint's ``router.pt`` (None: none, or a file from before it)."""
    path = Path(checkpoint) / ROUTER_FILE if checkpoint else None
    if path is None or not path.is_file():
        return None
    state = load_torch_file(path)
    return Threshold.from_state(state.get(THRESHOLD_KEY)) if isinstance(state, dict) else None


def describe(choice: RouteChoice) -> str:
    probs = "  ".join(f"{r} {p:.2f}" for r, p in choice.probs.items())
    note = " (fresh head: untrained, uniform)" if choice.fresh else ""
    if choice.mode == "threshold" and choice.tau is not None:
        p_tool = tool_probability(list(choice.probs.values()), list(choice.probs))
        rel = ">=" if p_tool >= choice.tau else "<"
        note += f"   threshold: P(tool) {p_tool:.2f} {rel} τ {choice.tau:.2f}"
    elif choice.mode == "sample":
        note += "   sampled"
    return f"route: {choice.route}   [{probs}]{note}"


def infer_mode(cfg: Any, router: RouterPolicy, threshold: Threshold | None, fresh: bool) -> str:
    """``router.infer_mode`` resolved for this head: ``auto`` is threshold when the budget
    binds (the checkpoint's τ knows its budget; else ``router.budget``), else argmax. Threshold
    routing without a τ (a checkpoint from before calibration, one saved before any validation,
    or a fresh head) falls back to argmax, with a warning for a trained head."""
    rc = cfg.router
    if threshold is not None:
        mode = resolve_infer_mode(rc.infer_mode, threshold.budget, threshold.max_cost)
    else:
        mode = resolve_infer_mode(rc.infer_mode, rc.budget, max_cost(rc.cost))
    if mode == "threshold" and threshold is None:
        if not fresh:
            log.warning(
                "router.pt has no calibrated threshold (saved before any validation, or by an "
                "older toolgrpo): routing by argmax, which the budget does not constrain; set "
                "trainer.test_freq so validation calibrates one, or router.infer_mode=sample"
            )
        return "argmax"
    if mode == "threshold" and ANSWER not in router.routes:
        return "argmax"  # no ANSWER route: every route is a tool, the threshold says nothing
    return mode


def route_for_infer(
    cfg: Any,
    lm: Any,
    task: Task,
    checkpoint: str | None,
    sample: bool = False,
    force: str | None = None,
    envs: Any = None,
) -> tuple[RouteChoice | None, Any]:
    """``toolgrpo infer``'s routing: the choice (None without a router) and the episode's
    prompt conditioning (None: the prompt as given). ``sample`` (``--sample``) samples the
    route as well as the tokens; otherwise ``router.infer_mode`` decides."""
    router, fresh = load_router(cfg, lm, checkpoint)
    if router is not None:
        threshold = saved_threshold(checkpoint)
        mode = "sample" if sample else infer_mode(cfg, router, threshold, fresh)
        mpl = cfg.data.max_prompt_length
        if envs is not None:
            router.read_tasks_with(envs, mpl)
        choice = choose_route(router, task, mpl, mode, force, fresh, threshold)
    elif force:
        choice = RouteChoice(check_name(force, ROUTES, "route"), {}, False)
    else:
        return None, None
    rc = cfg.router
    spec = saved_spec(checkpoint)
    return choice, conditioner(choice.route, rc.families_file, rc.family_tools_only, spec)
