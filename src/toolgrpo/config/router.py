"""Config of the budgeted tool router (``toolgrpo.router``) and its value checks.

An example (defaults are in ``RouterConfig``)::

    router:
      enable: true
      routes: [ANSWER, SEARCH, CALCULATE]  # what the head chooses among (a subset is allowed)
      pooling: last          # last | mean: the prompt representation
      inputs: opening        # opening (system prompt + tools + question) | question
      feature_layer: -1      # the LM hidden state the head reads (-1 = final, k = block k)
      feature_norm: standardize  # running per-dimension mean/std | layer (each vector alone)
      freeze_lm: true        # router-only training: the LM takes no update
      lr: 4.0                # the head's own SGD; null = a param group in the actor's optimizer
      head_ema: 0.95         # validation/eval/infer route with this EMA of the head (0 = last)
      offset_tasks: 100      # validation fits the served head's budget offset on this many
      offset_n: 2            #   training tasks × every route × offset_n episodes (0 = none)
      entropy_coeff: 0.1     # the bonus that makes the head's response to λ smooth
      budget: 0.3            # B: average tool cost per example
      lambda_init: 0.0       # λ at step 0 (a resumed run restores its own)
      dual_lr: 0.2           # η in λ ← max(0, λ + η·(mean_cost − B))
      dual_kp: 2.0           # k_p: λ = I + k_p·(mean_cost − B), I the ascent above (0 = plain)
      update_every: 1        # K: steps per dual step
      cost: {mode: any, c_search: 1.0, c_calc: 1.0, c_other: 1.0, max_calls: 4}
      family_tools_only: true  # SEARCH / CALCULATE offer their own family's tools only
      lm_reward: lagrangian  # the LM trains on r_task − λ·cost too (task: on r_task alone)
      lagrangian: price      # price: centred r_task − λ·cost | reward | advantage (see below)
      spread_decay: 0.9      # price's scale: a running within-group reward spread
      eval_baselines: true   # eval and validation also play every task under every route
      infer_mode: auto       # toolgrpo infer: threshold (budget binds) | argmax | sample
      families_file: ""      # sidecar {tool: SEARCH|CALCULATE|OTHER} overriding the heuristic
      label_file: ""         # weak labels from ``toolgrpo label``; label_coeff weighs them

Bad values raise ``ConfigError`` naming the key (``check_router_config``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolgrpo.router.routes import ROUTES, UnknownRoute, check_name

COST_MODES = ("any", "family", "calls")
POOLINGS = ("last", "mean")
FEATURE_NORMS = ("standardize", "layer")  # router.head.FEATURE_NORMS
FEATURE_INPUTS = ("opening", "question")  # router.inputs.FEATURE_INPUTS
LM_REWARDS = ("lagrangian", "task")
LAGRANGIANS = ("price", "reward", "advantage")
# How a trained head picks one route per prompt at inference (toolgrpo infer): ``auto`` is
# ``threshold`` when the budget binds (budget < max cost), else ``argmax``.
INFER_MODES = ("auto", "threshold", "argmax", "sample")


@dataclass
class RouterCostConfig:
    mode: str = "any"  # any: 1 if a tool was used | family: weights of families used | calls
    c_search: float = 1.0
    c_calc: float = 1.0
    c_other: float = 1.0  # tools of neither family
    max_calls: int = 4  # calls mode: more calls than this cost as much as this many


@dataclass
class RouterLabelerConfig:
    """Label at startup when ``router.label_file`` does not exist yet (``toolgrpo label`` does the
    same offline). An endpoint that is down or answers garbage is logged; training goes on."""

    base_url: str = ""  # an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1
    model: str = ""
    api_key_env: str = "OPENAI_API_KEY"  # the env var holding the key (unset: no auth header)
    timeout_s: float = 30.0


@dataclass
class RouterConfig:
    enable: bool = False
    routes: list[str] = field(default_factory=lambda: list(ROUTES))
    pooling: str = "last"
    # What the head reads: ``opening`` = the prompt the episode opens with before a route rewrites
    # it (system prompt, tool list, question); ``question`` = the task's own messages only.
    inputs: str = "opening"
    feature_layer: int = -1  # the LM hidden state it reads: −1 final, 0 embeddings, k block k
    # ``standardize``: subtract the running mean of the routed prompts' features and divide by
    # their std per dimension, so the direction every prompt shares does not drown what tells
    # tasks apart; ``layer``: each vector normalised alone (the head before this option).
    feature_norm: str = "standardize"
    head_hidden: int = 0  # 0 = a linear head; > 0 = one tanh hidden layer of this width
    freeze_lm: bool = False
    # SGD on unit-norm features: one step moves a prompt's logits by about lr·advantage; 4 lets a
    # fresh head converge within a run of ~60 steps (1 does not, 8 saturates; docs/router.md).
    # None = a param group in the actor's optimizer (its lr, e.g. 1e-6, is far too small).
    lr: float | None = 4.0
    # Validation, eval and infer route with an exponential average of the head's weights over
    # its updates (bias-corrected; this decay per update): under a moving λ the last iterate
    # swings past the budget and back, the average is what the run played. 0 = the last iterate.
    head_ema: float = 0.95
    # Each routed validation first plays this many training tasks (a seeded draw) under every
    # route, ``offset_n`` episodes each at the rollout's sampling, and fits one shift of the
    # served head's ANSWER logit so its routes spend B there (or at most B while the dual is 0;
    # router/offset.py): the averaged head at the end of a finite run can sit off the budget
    # the run held. Saved in router.pt; eval and infer route with it. 0 = no offset.
    offset_tasks: int = 100
    offset_n: int = 2
    grad_clip: float = 1.0
    # A real bonus (the design asks for "a small" one): a budgeted optimum mixes routes, and
    # without it the head's response to λ is nearly a step that the dual step can only chase.
    entropy_coeff: float = 0.1
    # reward/advantage modes: GRPO (True) or Dr.GRPO (False) groups; ``price`` has its own scale.
    norm_adv_by_std: bool = True
    budget: float = 0.3
    lambda_init: float = 0.0
    dual_lr: float = 0.2
    # Proportional gain on the cost error: λ = max(0, I + k_p·(cost − B)), I the dual-ascent
    # integral. 0 (the design's rule) is plain dual ascent, which swings past B and back when the
    # head reacts fast; > 0 damps the overshoot (docs/router.md, "The dual step").
    dual_kp: float = 2.0
    update_every: int = 1
    cost: RouterCostConfig = field(default_factory=RouterCostConfig)
    # SEARCH / CALCULATE offer (and run) their own family's tools only, so the two routes differ
    # in what they can do; false = the design's literal prompts (all tools kept, one favoured).
    family_tools_only: bool = True
    families_file: str = ""
    label_file: str = ""
    label_coeff: float = 0.0
    labeler: RouterLabelerConfig = field(default_factory=RouterLabelerConfig)
    # What the LM's own GRPO/PPO reward is: ``lagrangian`` = r_task − λ·cost (the router's λ,
    # the same step), so the LM gains nothing by calling tools a route did not ask for; ``task``
    # = r_task alone (the LM then learns to call tools whatever the route says).
    lm_reward: str = "lagrangian"
    # Where λ·cost enters, for the router and (lm_reward=lagrangian) the LM. ``price`` (default):
    # A = [(r_task − λ·cost) − group mean] / s, s the running within-group reward spread, so each
    # task keeps its own gain per tool call and λ is a price in reward per unit cost. ``reward``
    # (A = Z(r_task − λ·cost), the design's rule) and ``advantage`` (Z(r_task) − λ·Z(cost))
    # normalise by each group's std: a tied group turns any λ > 0 into a unit-size push to ANSWER
    # under ``reward``, and both erase how much a tool adds per task (docs/router.md).
    lagrangian: str = "price"
    # ``price``'s scale s: the square root of an exponential average (this decay per step,
    # bias-corrected) of each step's within-group variance of task reward, so s moves smoothly
    # when groups start or stop tying. 0 = each batch's own spread (1 when every group ties).
    spread_decay: float = 0.9
    # Routed eval and validation also play every task under every route: the fixed-route
    # baselines (always ANSWER, always the task's family, best route in hindsight); K× episodes.
    eval_baselines: bool = True
    # The route ``toolgrpo infer`` plays: ``threshold`` (a tool route iff P(tool) >= the τ that
    # validation calibrated to keep the budget; router/calibrate.py), ``argmax``, ``sample``, or
    # ``auto`` (threshold when the budget binds, else argmax). docs/router.md, "Inference".
    infer_mode: str = "auto"


def max_cost(c: RouterCostConfig) -> float:
    """The largest cost of one trajectory under ``c`` (mirrors ``router.usage.CostModel``)."""
    weights = (c.c_search, c.c_calc, c.c_other)
    if c.mode == "any":
        return 1.0
    if c.mode == "family":
        return float(sum(weights))
    return float(c.max_calls * max(weights))


def check_router_config(cfg: Any) -> None:
    """Raise ConfigError naming the key for router settings the trainer cannot honour (checked
    even when the router is off, so a typo surfaces before it is used)."""
    from toolgrpo.config.loader import ConfigError

    rc: RouterConfig = cfg.router
    for i, name in enumerate(rc.routes):
        try:
            check_name(name, ROUTES, "route")
        except UnknownRoute as e:
            raise ConfigError(f"router.routes[{i}]: {e}") from None
    routes = [str(r).upper() for r in rc.routes]
    if len(set(routes)) != len(routes) or len(routes) < 2:
        raise ConfigError(f"router.routes needs at least 2 distinct routes, got {rc.routes}")
    if rc.pooling not in POOLINGS:
        raise ConfigError(f"router.pooling={rc.pooling!r} is not one of {', '.join(POOLINGS)}")
    for key, value in (("router.head_ema", rc.head_ema), ("router.spread_decay", rc.spread_decay)):
        if not 0.0 <= float(value) < 1.0:
            raise ConfigError(f"{key} must be in [0, 1), got {value}")
    if rc.feature_norm not in FEATURE_NORMS:
        raise ConfigError(
            f"router.feature_norm={rc.feature_norm!r} is not one of {', '.join(FEATURE_NORMS)}"
        )
    if rc.inputs not in FEATURE_INPUTS:
        raise ConfigError(f"router.inputs={rc.inputs!r} is not one of {', '.join(FEATURE_INPUTS)}")
    if not isinstance(rc.feature_layer, int) or rc.feature_layer < -1:
        raise ConfigError(
            f"router.feature_layer must be -1 (the final state) or a block index >= 0, "
            f"got {rc.feature_layer}"
        )
    for key, value, allowed in (
        ("router.lm_reward", rc.lm_reward, LM_REWARDS),
        ("router.lagrangian", rc.lagrangian, LAGRANGIANS),
        ("router.infer_mode", rc.infer_mode, INFER_MODES),
    ):
        if value not in allowed:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}")
    if rc.cost.mode not in COST_MODES:
        raise ConfigError(
            f"router.cost.mode={rc.cost.mode!r} is not one of {', '.join(COST_MODES)}"
        )
    nonneg = {
        "router.cost.c_search": rc.cost.c_search,
        "router.cost.c_calc": rc.cost.c_calc,
        "router.cost.c_other": rc.cost.c_other,
        "router.entropy_coeff": rc.entropy_coeff,
        "router.lambda_init": rc.lambda_init,
        "router.dual_lr": rc.dual_lr,
        "router.dual_kp": rc.dual_kp,
        "router.label_coeff": rc.label_coeff,
        "router.head_hidden": rc.head_hidden,
        "router.offset_tasks": rc.offset_tasks,
    }
    for key, value in nonneg.items():
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{key} must be a finite number >= 0, got {value}")
    for key, value in {
        "router.cost.max_calls": rc.cost.max_calls,
        "router.update_every": rc.update_every,
        "router.grad_clip": rc.grad_clip,
        "router.offset_n": rc.offset_n,
    }.items():
        if not value > 0:
            raise ConfigError(f"{key} must be > 0, got {value}")
    if rc.lr is not None and not (math.isfinite(rc.lr) and rc.lr > 0):
        raise ConfigError(f"router.lr must be > 0 (or null for the actor's optimizer), got {rc.lr}")
    top = max_cost(rc.cost)
    if not (math.isfinite(rc.budget) and 0 <= rc.budget <= top):
        raise ConfigError(
            f"router.budget={rc.budget} must lie in [0, {top:g}], the cost range of "
            f"router.cost.mode={rc.cost.mode} with these weights"
        )
    if rc.label_coeff > 0 and not (rc.label_file or rc.labeler.base_url):
        raise ConfigError("router.label_coeff > 0 needs router.label_file (or router.labeler)")
    if rc.labeler.base_url and not rc.labeler.model:
        raise ConfigError("router.labeler.base_url is set: name the model (router.labeler.model)")
    if rc.labeler.timeout_s <= 0:
        raise ConfigError(f"router.labeler.timeout_s must be > 0, got {rc.labeler.timeout_s}")
    if rc.families_file and not Path(rc.families_file).is_file():
        raise ConfigError(f"router.families_file={rc.families_file!r} is not a file")
    if rc.label_file and not rc.labeler.base_url and not Path(rc.label_file).is_file():
        raise ConfigError(
            f"router.label_file={rc.label_file!r} is not a file (write one with toolgrpo label)"
        )
    check_call_cost(cfg)
    if not rc.enable:
        return
    if cfg.async_training.enable:
        raise ConfigError("router.enable does not support async_training.enable yet")
    est = cfg.algorithm.adv_estimator
    if rc.lm_reward == "lagrangian" and rc.lagrangian != "reward" and not rc.freeze_lm:
        if est not in ("grpo", "dr_grpo"):
            raise ConfigError(
                f"router.lagrangian={rc.lagrangian} centres cost within GRPO groups, but "
                f"algorithm.adv_estimator={est}: use grpo or dr_grpo, router.lagrangian=reward, "
                "or router.lm_reward=task"
            )
    if cfg.actor_rollout_ref.rollout.n < 2:
        raise ConfigError(
            "router.enable compares the routes of one prompt's rollouts: set "
            "actor_rollout_ref.rollout.n >= 2"
        )


def check_call_cost(cfg: Any) -> None:
    """``reward.tool_call_cost`` is the router's fixed-price sibling (the LM alone pays per call,
    through the same price the router hands the LM): not both at once, and not with dynamic
    sampling, which keeps groups by their task rewards before any price is applied."""
    from toolgrpo.config.loader import ConfigError

    c = cfg.reward.tool_call_cost
    if not c > 0:
        return
    if cfg.router.enable:
        raise ConfigError(
            "reward.tool_call_cost prices calls without a router; with router.enable the router's "
            "λ prices them: set one of the two"
        )
    if cfg.algorithm.filter_groups.enable:
        raise ConfigError(
            "reward.tool_call_cost does not run with algorithm.filter_groups.enable yet (groups "
            "are kept by their task rewards, before the price): turn one off"
        )
