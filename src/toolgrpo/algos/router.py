"""The budgeted router's objective as pure tensor functions: a Lagrangian reward, GRPO
advantages over it (or the advantage-level Lagrangian), a policy-gradient loss over route
choices, and the dual step on λ."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import torch

from toolgrpo.algos.advantages import compute_grpo_advantages


def router_rewards(task_B: torch.Tensor, cost_B: torch.Tensor, lam: float) -> torch.Tensor:
    """r_router = r_task − λ·cost: the Lagrangian of "maximise reward s.t. E[cost] ≤ B"."""
    return task_B.float() - float(lam) * cost_B.float()


def router_advantages(
    rewards_B: torch.Tensor, uids: Sequence[Hashable], norm_by_std: bool = True
) -> torch.Tensor:
    """GRPO over the routes sampled for one prompt (its rollouts share a uid): one scalar each."""
    ones = torch.ones(rewards_B.shape[0], 1)
    adv_B1, _ = compute_grpo_advantages(rewards_B.float(), ones, uids, norm_by_std)
    return adv_B1[:, 0].float()


LAGRANGIAN_MODES = ("price", "reward", "advantage")


def group_z(
    values_B: torch.Tensor,
    uids: Sequence[Hashable],
    norm_by_std: bool = True,
    is_negative_B: Sequence[bool] | None = None,
) -> torch.Tensor:
    """Z within each uid group, one scalar per row: GRPO's (v − mean)/(std + ε), or v − mean
    (Dr.GRPO). Rows flagged ``is_negative_B`` (rolled-back attempts) get 0: they are no sample
    of the group's cost."""
    ones = torch.ones(values_B.shape[0], 1)
    flags = list(is_negative_B) if is_negative_B is not None else [False] * values_B.shape[0]
    real = [i for i, neg in enumerate(flags) if not neg]
    out = torch.zeros(values_B.shape[0], dtype=torch.float32)
    if real:
        z_B1, _ = compute_grpo_advantages(
            values_B[real].float(), ones[real], [uids[i] for i in real], norm_by_std
        )
        out[real] = z_B1[:, 0].float()
    return out


def within_group_variance(
    task_B: torch.Tensor,
    uids: Sequence[Hashable],
    is_negative_B: Sequence[bool] | None = None,
) -> float:
    """The batch's within-group variance of task reward: the (unbiased) variance over rows of
    r − mean_group(r), rows flagged ``is_negative_B`` left out. 0 when every group ties."""
    flags = list(is_negative_B) if is_negative_B is not None else [False] * task_B.shape[0]
    real = [i for i, neg in enumerate(flags) if not neg]
    if len(real) < 2:
        return 0.0
    dev = group_z(task_B[real].float(), [uids[i] for i in real], norm_by_std=False)
    return float(dev.var())


def reward_spread(task_B: torch.Tensor, uids: Sequence[Hashable], eps: float = 1e-6) -> float:
    """This batch's within-group spread of task reward (the std of r − mean_group(r)); 1 when
    every group ties. ``spread_value`` with decay 0: the price scale of one batch alone."""
    return spread_value(within_group_variance(task_B, uids), 1, 0.0, eps)


def running_variance(
    mean_sq: float, steps: int, variance: float, decay: float
) -> tuple[float, int]:
    """One step of the exponential average of the within-group variance: (average, steps)."""
    return float(decay) * float(mean_sq) + (1.0 - float(decay)) * float(variance), steps + 1


def spread_value(mean_sq: float, steps: int, decay: float, eps: float = 1e-6) -> float:
    """The price scale s: the square root of the bias-corrected average (so the zero start
    weighs nothing); 1 before any step or while every step so far tied (no reward signal to
    scale by: λ·cost then stays in reward units). With decay 0 it is the last batch's spread."""
    if steps <= 0:
        return 1.0
    spread = math.sqrt(max(mean_sq, 0.0) / (1.0 - float(decay) ** steps))
    return spread if spread > eps else 1.0


def price_advantages(
    task_B: torch.Tensor,
    cost_B: torch.Tensor,
    lam: float,
    uids: Sequence[Hashable],
    is_negative_B: Sequence[bool] | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """A = [(r − λ·c) − mean_group(r − λ·c)] / s. Centring within the group keeps each task's
    own gain per tool call (a task where a tool adds +0.9 outranks one where it adds +0.1); one
    scale for every group keeps λ a price in reward per unit cost, the same in every group; and
    a group whose task rewards tie gets −λ·(c − c̄)/s, a push in proportion to λ, not a
    unit-size one. ``scale``: s (the router's running spread, ``router.spread_decay``); None =
    this batch's own within-group spread (``reward_spread``). Flagged rows get 0 and stay out
    of the group means."""
    flags = list(is_negative_B) if is_negative_B is not None else [False] * task_B.shape[0]
    real = [i for i, neg in enumerate(flags) if not neg]
    out = torch.zeros(task_B.shape[0], dtype=torch.float32)
    if real:
        ids = [uids[i] for i in real]
        centred = group_z(router_rewards(task_B[real], cost_B[real], lam), ids, norm_by_std=False)
        s = scale if scale is not None else reward_spread(task_B[real].float(), ids)
        out[real] = centred / float(s)
    return out


def lagrangian_advantages(
    task_B: torch.Tensor,
    cost_B: torch.Tensor,
    lam: float,
    uids: Sequence[Hashable],
    mode: str = "reward",
    norm_by_std: bool = True,
    scale: float | None = None,
    is_negative_B: Sequence[bool] | None = None,
) -> torch.Tensor:
    """One advantage per rollout under the budget's Lagrangian; rows flagged ``is_negative_B``
    get 0 and stay out of their group's statistics.

    ``price`` (``price_advantages``, over ``scale``): r_task − λ·cost centred within the group,
    over one scale for the batch; ``norm_by_std`` does not apply. ``reward``: A = Z(r_task −
    λ·cost), the Lagrangian in the reward (the design's rule). ``advantage``: A = Z(r_task) −
    λ·Z(cost), task reward and cost normalised separately in each group. Under std
    normalisation the first rescales λ·cost by each group's reward spread (a group of near-equal
    rewards makes the same λ weigh far more), so λ means something different in every group;
    the second keeps λ the exchange rate between two unit-scale signals, and both erase how much
    a tool adds to one task against another."""
    if mode == "price":
        return price_advantages(task_B, cost_B, lam, uids, is_negative_B, scale)
    if mode == "reward":
        return group_z(router_rewards(task_B, cost_B, lam), uids, norm_by_std, is_negative_B)
    if mode == "advantage":
        z_task = group_z(task_B, uids, norm_by_std, is_negative_B)
        return z_task - float(lam) * group_z(cost_B, uids, norm_by_std, is_negative_B)
    raise ValueError(f"unknown lagrangian mode {mode!r}; known: {', '.join(LAGRANGIAN_MODES)}")


def route_entropy(logits_BK: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits_BK.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def router_loss(
    logits_BK: torch.Tensor,
    actions_B: torch.Tensor,
    advantages_B: torch.Tensor,
    entropy_coeff: float = 0.0,
    labels_B: torch.Tensor | None = None,
    label_coeff: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """−mean(log π(a|x)·A) − c_H·mean(H(π(·|x))) + c_L·CE(π, weak label).

    ``labels_B`` holds a route index per row, or −1 where there is no usable label (none, or
    MIXED); the cross-entropy averages over labelled rows only and is 0 without any.
    """
    logp_BK = torch.log_softmax(logits_BK.float(), dim=-1)
    logp_B = logp_BK.gather(-1, actions_B.long().view(-1, 1)).squeeze(-1)
    pg = -(logp_B * advantages_B.detach().float()).mean()
    entropy = route_entropy(logits_BK).mean()
    ce = logits_BK.new_zeros((), dtype=torch.float32)
    if labels_B is not None and label_coeff > 0 and bool((labels_B >= 0).any()):
        keep = labels_B >= 0
        ce = torch.nn.functional.nll_loss(logp_BK[keep], labels_B[keep].long())
    loss = pg - entropy_coeff * entropy + label_coeff * ce
    metrics = {
        "router/pg_loss": float(pg.detach()),
        "router/entropy": float(entropy.detach()),
        "router/label_ce": float(ce.detach()),
        "router/loss": float(loss.detach()),
    }
    return loss, metrics


def dual_update(lam: float, mean_cost: float, budget: float, lr: float) -> float:
    """Projected dual ascent: λ ← max(0, λ + η·(mean_cost − B)). Overspending raises the price
    of a tool call; underspending lowers it, never below zero."""
    return max(0.0, float(lam) + float(lr) * (float(mean_cost) - float(budget)))


def pi_dual_update(
    integral: float, mean_cost: float, budget: float, lr: float, kp: float
) -> tuple[float, float]:
    """Dual ascent with a proportional term (a PI controller on the cost error e = cost − B):
    I ← max(0, I + η·e), λ = max(0, I + k_p·e); returns (I, λ). The integral alone is
    ``dual_update``; k_p prices the current overspend at once, so λ need not integrate far past
    the equilibrium price before the policy reacts, and the overshoot that follows shrinks
    (Stooke et al., 2020, "Responsive Safety in RL by PID Lagrangian Methods")."""
    integral = dual_update(integral, mean_cost, budget, lr)
    return integral, max(0.0, integral + float(kp) * (float(mean_cost) - float(budget)))
