"""The budgeted router's objective as pure tensor functions: a Lagrangian reward, GRPO
advantages over it (or the advantage-level Lagrangian), a policy-gradient loss over route
choices, and the dual step on λ."""

from __future__ import annotations

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


def reward_spread(task_B: torch.Tensor, uids: Sequence[Hashable], eps: float = 1e-6) -> float:
    """The batch's within-group spread of task reward: the std over rows of r − mean_group(r).
    1 when every group ties (no reward signal to scale by; λ·cost then stays in reward units)."""
    dev = group_z(task_B, uids, norm_by_std=False)
    spread = float(dev.std()) if dev.numel() > 1 else 0.0
    return spread if spread > eps else 1.0


def price_advantages(
    task_B: torch.Tensor,
    cost_B: torch.Tensor,
    lam: float,
    uids: Sequence[Hashable],
    is_negative_B: Sequence[bool] | None = None,
) -> torch.Tensor:
    """A = [(r − λ·c) − mean_group(r − λ·c)] / s, with s the batch's within-group task-reward
    spread (``reward_spread``). Centring within the group keeps each task's own gain per tool
    call (a task where a tool adds +0.9 outranks one where it adds +0.1); one scale for the whole
    batch keeps λ a price in reward per unit cost, the same in every group; and a group whose task
    rewards tie gets −λ·(c − c̄)/s, a push in proportion to λ, not a unit-size one."""
    flags = list(is_negative_B) if is_negative_B is not None else [False] * task_B.shape[0]
    real = [i for i, neg in enumerate(flags) if not neg]
    out = torch.zeros(task_B.shape[0], dtype=torch.float32)
    if real:
        ids = [uids[i] for i in real]
        centred = group_z(router_rewards(task_B[real], cost_B[real], lam), ids, norm_by_std=False)
        out[real] = centred / reward_spread(task_B[real].float(), ids)
    return out


def lagrangian_advantages(
    task_B: torch.Tensor,
    cost_B: torch.Tensor,
    lam: float,
    uids: Sequence[Hashable],
    mode: str = "reward",
    norm_by_std: bool = True,
) -> torch.Tensor:
    """One advantage per rollout under the budget's Lagrangian.

    ``price`` (``price_advantages``): r_task − λ·cost centred within the group, over the batch's
    reward spread; ``norm_by_std`` does not apply. ``reward``: A = Z(r_task − λ·cost), the
    Lagrangian in the reward. ``advantage``: A = Z(r_task) − λ·Z(cost), task reward and cost
    normalised separately in each group. Under std normalisation the first rescales λ·cost by
    each group's reward spread (a group of near-equal rewards makes the same λ weigh far more),
    so λ means something different in every group; the second keeps λ the exchange rate between
    two unit-scale signals, and both erase how much a tool adds to one task against another."""
    if mode == "price":
        return price_advantages(task_B, cost_B, lam, uids)
    if mode == "reward":
        return router_advantages(router_rewards(task_B, cost_B, lam), uids, norm_by_std)
    if mode == "advantage":
        z_task = group_z(task_B, uids, norm_by_std)
        return z_task - float(lam) * group_z(cost_B, uids, norm_by_std)
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
