"""Advantage estimators (GRPO, Dr.GRPO, RLOO, GAE) behind a string registry.

Every estimator returns ``(advantages_BT, returns_BT)``; positions with response mask 0 are 0.
Outcome estimators take one scalar score per sample and a ``uids`` sequence: samples sharing a
uid (the rollouts of one prompt) form a group, in any order in the batch. They also take an
optional ``is_negative_B`` (rolled-back attempts, issue #14): negatives never enter their group's
baseline and never get a positive advantage (``_negative_advantages``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Hashable, Sequence

import torch

from toolgrpo.algos import kl as _kl
from toolgrpo.algos.utils import masked_mean, masked_whiten

__all__ = [
    "register_adv_estimator",
    "get_adv_estimator",
    "compute_advantages",
    "compute_grpo_advantages",
    "compute_dr_grpo_advantages",
    "compute_rloo_advantages",
    "compute_gae_advantages",
    "token_level_rewards",
    "apply_kl_in_reward",
]

AdvEstimator = Callable[..., tuple[torch.Tensor, torch.Tensor]]
Flags = Sequence[bool] | torch.Tensor
_ADV_ESTIMATORS: dict[str, AdvEstimator] = {}


def register_adv_estimator(name: str) -> Callable[[AdvEstimator], AdvEstimator]:
    """Decorator registering an estimator under ``name``; re-registering another function fails."""

    def decorator(fn: AdvEstimator) -> AdvEstimator:
        existing = _ADV_ESTIMATORS.get(name)
        if existing is not None and existing is not fn:
            raise ValueError(f"advantage estimator {name!r} is already registered to {existing}")
        _ADV_ESTIMATORS[name] = fn
        return fn

    return decorator


def get_adv_estimator(name: str) -> AdvEstimator:
    """Look up an estimator by name; unknown names raise ValueError listing the known ones."""
    try:
        return _ADV_ESTIMATORS[name]
    except KeyError:
        known = ", ".join(sorted(_ADV_ESTIMATORS))
        raise ValueError(f"unknown advantage estimator {name!r}; known: {known}") from None


def _groups(scores_B: torch.Tensor, uids: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    """Map each uid to its batch indices, rejecting non-finite scores by naming their uid."""
    if scores_B.dim() != 1:
        raise ValueError(f"scores_B must be 1-D, got shape {tuple(scores_B.shape)}")
    if len(uids) != scores_B.shape[0]:
        raise ValueError(f"got {len(uids)} uids for {scores_B.shape[0]} scores")
    groups: dict[Hashable, list[int]] = {}
    for i, uid in enumerate(uids):
        groups.setdefault(uid, []).append(i)
    finite = torch.isfinite(scores_B).tolist()
    for uid, idx in groups.items():
        bad = [i for i in idx if not finite[i]]
        if bad:
            raise ValueError(
                f"non-finite score in group uid={uid!r} at batch indices {bad}: "
                f"{[scores_B[i].item() for i in bad]}"
            )
    return groups


def _broadcast(
    adv_B: torch.Tensor, response_mask_BT: torch.Tensor, like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Spread one advantage per sample over its response tokens (0 where mask is 0)."""
    dtype = like.dtype if like.is_floating_point() else torch.get_default_dtype()
    adv_BT = adv_B.to(dtype).unsqueeze(-1) * response_mask_BT.to(dtype)
    return adv_BT, adv_BT.clone()


def _negative_flags(is_negative_B: Flags | None, n: int) -> list[bool]:
    """One flag per sample; ``None`` or an empty sequence means no negatives."""
    if is_negative_B is None or len(is_negative_B) == 0:
        return [False] * n
    flags = [
        bool(x)
        for x in (is_negative_B.tolist() if torch.is_tensor(is_negative_B) else is_negative_B)
    ]
    if len(flags) != n:
        raise ValueError(f"got {len(flags)} is_negative_B flags for {n} scores")
    return flags


def _split(idx: list[int], flags: list[bool]) -> tuple[list[int], list[int]]:
    """A group's real members and its negatives."""
    return [i for i in idx if not flags[i]], [i for i in idx if flags[i]]


def _negative_advantages(
    s64: torch.Tensor, real: list[int], neg: list[int], scale: bool
) -> torch.Tensor:
    """A negative's advantage: its gap to the real members' mean, never positive.

    The baseline is the mean of the group's REAL members only, so negatives never move the real
    members' advantages. With ``scale`` (GRPO's std division) the gap is divided by the std of the
    whole group, negatives included: it is > 0 whenever a negative differs from the real members
    (so a group whose real members all scored the same still trains its negative), and it bounds
    |A| by sqrt(group size) where the real members' std alone could be ~0 and blow the gap up.
    The clamp at 0: a rolled-back attempt is a failure by construction and must never be
    reinforced, even if every real member scored below ``negative_reward``. A group with no real
    member has no baseline: its negatives get 0.
    """
    if not real:
        return torch.zeros(len(neg), dtype=s64.dtype)
    gap = s64[neg] - s64[real].mean()
    if scale:
        std = s64[real + neg].std() if len(real) + len(neg) > 1 else s64.new_tensor(0.0)
        gap = gap / std if bool(std > 0) else torch.zeros_like(gap)
    return gap.clamp(max=0.0)


@register_adv_estimator("grpo")
@torch.no_grad()
def compute_grpo_advantages(
    scores_B: torch.Tensor,
    response_mask_BT: torch.Tensor,
    uids: Sequence[Hashable],
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
    is_negative_B: Flags | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: A_i = (s_i - mean_g) / (std_g + eps) with unbiased std, or s_i - mean_g (Dr.GRPO).

    Trap (verl semantics): a singleton group uses mean 0 / std 1, so its advantage is the RAW
    score s/(1+eps), not 0. A group whose scores are all equal gets exactly 0. Returns == advs.
    mean_g and std_g are over the group's real members; negatives (``is_negative_B``) get
    ``_negative_advantages``.
    """
    groups = _groups(scores_B, uids)
    flags = _negative_flags(is_negative_B, scores_B.shape[0])
    s64 = scores_B.detach().to(torch.float64)
    adv = torch.zeros_like(s64)
    for members in groups.values():
        idx, neg = _split(members, flags)
        if neg:
            adv[neg] = _negative_advantages(s64, idx, neg, norm_adv_by_std_in_grpo)
        s = s64[idx]
        if len(idx) == 0:
            continue
        if len(idx) == 1:
            mean, std = 0.0, 1.0
        elif bool((s == s[0]).all()):
            continue  # exactly 0, no rounding noise amplified by 1/eps
        else:
            mean, std = s.mean(), s.std()  # unbiased (n - 1), as torch.std
        adv[idx] = (s - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else s - mean
    return _broadcast(adv, response_mask_BT, scores_B)


@register_adv_estimator("dr_grpo")
def compute_dr_grpo_advantages(
    scores_B: torch.Tensor,
    response_mask_BT: torch.Tensor,
    uids: Sequence[Hashable],
    epsilon: float = 1e-6,
    is_negative_B: Flags | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dr.GRPO: GRPO without the std division (A = s - mean_g), to avoid difficulty bias; a
    negative gets min(0, s - mean of the real members)."""
    return compute_grpo_advantages(
        scores_B,
        response_mask_BT,
        uids,
        norm_adv_by_std_in_grpo=False,
        epsilon=epsilon,
        is_negative_B=is_negative_B,
    )


@register_adv_estimator("rloo")
@torch.no_grad()
def compute_rloo_advantages(
    scores_B: torch.Tensor,
    response_mask_BT: torch.Tensor,
    uids: Sequence[Hashable],
    is_negative_B: Flags | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: A_i = s_i - mean of the others = n/(n-1) (s_i - mean_g).

    Trap (verl ``rloo``): a singleton group has no leave-one-out baseline, so A = raw score.
    "The others" are the real members only; a negative is none of them, so its baseline is the
    mean of all real members: A = min(0, s - mean of the real members).
    """
    groups = _groups(scores_B, uids)
    flags = _negative_flags(is_negative_B, scores_B.shape[0])
    s64 = scores_B.detach().to(torch.float64)
    adv = torch.zeros_like(s64)
    for members in groups.values():
        idx, neg = _split(members, flags)
        if neg:
            adv[neg] = _negative_advantages(s64, idx, neg, scale=False)
        s = s64[idx]
        n = len(idx)
        if n == 0:
            continue
        if n == 1:
            adv[idx] = s
        elif not bool((s == s[0]).all()):
            adv[idx] = n / (n - 1) * (s - s.mean())
    return _broadcast(adv, response_mask_BT, scores_B)


@register_adv_estimator("gae")
@torch.no_grad()
def compute_gae_advantages(
    token_rewards_BT: torch.Tensor,
    values_BT: torch.Tensor,
    response_mask_BT: torch.Tensor,
    gamma: float,
    lam: float,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over response tokens; mask-0 tokens (tool output, padding) are skipped, not chain breaks.

    Skipped tokens produce no TD error and carry next-value / running GAE through unchanged (verl
    multi-turn). returns = adv + values; then adv is whitened over the batch if ``whiten``.
    """
    if not (token_rewards_BT.shape == values_BT.shape == response_mask_BT.shape):
        raise ValueError("token_rewards_BT, values_BT and response_mask_BT must share one shape")
    rewards = token_rewards_BT.detach()
    values = values_BT.detach().to(rewards.dtype)
    valid = response_mask_BT != 0
    next_value = torch.zeros_like(rewards[:, 0])
    running = torch.zeros_like(rewards[:, 0])
    adv = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        step = delta + gamma * lam * running
        running = torch.where(valid[:, t], step, running)
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        adv[:, t] = running
    mask_f = valid.to(rewards.dtype)
    returns = (adv + values) * mask_f
    if whiten:
        adv = masked_whiten(adv, mask_f)
    return adv * mask_f, returns


def token_level_rewards(scores_B: torch.Tensor, response_mask_BT: torch.Tensor) -> torch.Tensor:
    """Put each outcome score on its last mask-1 response token (as verl's reward loop does).

    Rows without any mask-1 token (pure padding rows) get no reward.
    """
    if scores_B.dim() != 1 or scores_B.shape[0] != response_mask_BT.shape[0]:
        raise ValueError("scores_B must be 1-D with one score per row of response_mask_BT")
    valid = response_mask_BT != 0
    T = valid.shape[1]
    last = T - 1 - torch.argmax(valid.flip(-1).to(torch.int8), dim=-1)
    has = valid.any(dim=-1)
    dtype = scores_B.dtype if scores_B.is_floating_point() else torch.get_default_dtype()
    out = torch.zeros(valid.shape, dtype=dtype, device=scores_B.device)
    rows = torch.arange(valid.shape[0], device=valid.device)
    out[rows[has], last[has]] = scores_B[has].to(dtype)
    return out


@torch.no_grad()
def apply_kl_in_reward(
    token_rewards_BT: torch.Tensor,
    old_logprobs_BT: torch.Tensor,
    ref_logprobs_BT: torch.Tensor,
    response_mask_BT: torch.Tensor,
    kl_coef: float,
    kl_penalty: str = "kl",
) -> tuple[torch.Tensor, float]:
    """Subtract kl_coef * KL(old || ref) per token from the rewards (verl use_kl_in_reward).

    Returns (new rewards, mean KL): per-sequence token-mean KL averaged over non-empty sequences,
    the value to feed to the KL controller's ``update``.
    """
    kld = _kl.kl_penalty(old_logprobs_BT, ref_logprobs_BT, kl_penalty)
    mask_f = (response_mask_BT != 0).to(kld.dtype)
    kld = torch.where(mask_f != 0, kld, torch.zeros_like(kld))
    new_rewards = token_rewards_BT - kl_coef * kld
    has = mask_f.sum(-1) > 0
    per_seq = masked_mean(kld, mask_f, dim=-1)
    mean_kl = per_seq[has].mean().item() if bool(has.any()) else 0.0
    return new_rewards, float(mean_kl)


def compute_advantages(
    name: str,
    *,
    scores_B: torch.Tensor,
    response_mask_BT: torch.Tensor,
    uids: Sequence[Hashable],
    token_rewards_BT: torch.Tensor | None = None,
    values_BT: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    is_negative_B: Flags | None = None,
    on_policy_B: Flags | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Single trainer entry point: run estimator ``name`` with the arguments it declares.

    Each argument is passed only if the estimator's signature names it. If ``token_rewards_BT``
    is None it is built from ``scores_B`` with ``token_level_rewards``. A batch with negatives
    is refused by an estimator that does not declare ``is_negative_B``: it would rank them as
    real members and shift its baselines.
    """
    fn = get_adv_estimator(name)
    if token_rewards_BT is None:
        token_rewards_BT = token_level_rewards(scores_B, response_mask_BT)
    available = {
        "scores_B": scores_B,
        "response_mask_BT": response_mask_BT,
        "uids": uids,
        "token_rewards_BT": token_rewards_BT,
        "values_BT": values_BT,
        "gamma": gamma,
        "lam": lam,
        "norm_adv_by_std_in_grpo": norm_adv_by_std_in_grpo,
        "is_negative_B": is_negative_B,
        "on_policy_B": on_policy_B,  # rows the actor sampled (a mixture's; grpo_split reads it)
    }
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = available
    else:
        kwargs = {k: v for k, v in available.items() if k in params}
    has_negatives = is_negative_B is not None and any(bool(x) for x in is_negative_B)
    if has_negatives and "is_negative_B" not in kwargs:
        raise ValueError(
            f"advantage estimator {name!r} does not take is_negative_B, but the batch has negative "
            "samples: turn actor_rollout_ref.rollout.multi_turn.save_negative_samples off"
        )
    if "values_BT" in params and values_BT is None:
        raise ValueError(f"advantage estimator {name!r} needs values_BT (a critic)")
    for key in ("gamma", "lam"):
        if key in kwargs and not math.isfinite(kwargs[key]):
            raise ValueError(f"{key} must be finite, got {kwargs[key]}")
    return fn(**kwargs)
