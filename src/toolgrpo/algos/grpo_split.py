"""GRPO with an on-policy baseline (LUFFY's ``grpo_split``) for groups that mix policies.

In a mixed group (the actor's n samples + k of a fixed policy, ``toolgrpo.mixture.groups``) plain
GRPO takes the mean and std over all n + k members. When every actor sample fails and a fixed
sample succeeds, each actor member then gets −mean/std: most of the update's weight pushes down
the actor's own failures, and little of it pulls towards the success. ``grpo_split`` takes the
baseline (mean, and std when normalising) over the group's on-policy members only and applies it
to every member:

    A_i = (s_i − mean_on) / (std_on + ε)         (or s_i − mean_on without std)

so the actor's samples get exactly the advantage they would have alone (0 in a group where they
all scored the same) and a fixed sample gets its gain over the actor's mean. A group whose
actor samples all scored the same has std_on = 0, which is taken as 1 (LUFFY's rule), so a fixed
success there gets s − mean_on, not a blow-up by 1/ε. A singleton on-policy member uses mean 0,
std 1 (verl's GRPO rule). A group with no on-policy member (a whole group a fixed policy sampled)
is ranked among its own members as plain GRPO does. Without ``on_policy_B`` (no mixture) every
row is on-policy and this is GRPO exactly.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from toolgrpo.algos.advantages import (
    Flags,
    _broadcast,
    _groups,
    _negative_advantages,
    _negative_flags,
    _split,
    register_adv_estimator,
)

__all__ = ["compute_grpo_split_advantages"]


def _baseline(s: torch.Tensor, norm: bool) -> tuple[torch.Tensor | float, torch.Tensor | float]:
    """Mean and scale of on-policy scores ``s``: (0, 1) for one member, std 0 taken as 1."""
    if s.numel() == 1:
        return 0.0, 1.0
    std = s.std() if norm else s.new_tensor(1.0)
    return s.mean(), std if bool(std > 0) else s.new_tensor(1.0)


def _on_policy_flags(on_policy_B: Flags | None, n: int) -> list[bool] | None:
    """One flag per row, or None (every row on-policy) for ``None`` or an empty sequence."""
    if on_policy_B is None or len(on_policy_B) == 0:
        return None
    flags = on_policy_B.tolist() if torch.is_tensor(on_policy_B) else list(on_policy_B)
    if len(flags) != n:
        raise ValueError(f"got {len(flags)} on_policy_B flags for {n} scores")
    return [bool(x) for x in flags]


@register_adv_estimator("grpo_split")
@torch.no_grad()
def compute_grpo_split_advantages(
    scores_B: torch.Tensor,
    response_mask_BT: torch.Tensor,
    uids: Sequence[Hashable],
    on_policy_B: Flags | None = None,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
    is_negative_B: Flags | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``on_policy_B``: True for rows the actor sampled (None or empty: every row). Rolled-back
    negatives (``is_negative_B``) stay out of the baseline and never get a positive advantage
    (their gap to the on-policy members' mean, as GRPO's negatives). Returns == advantages."""
    groups = _groups(scores_B, uids)
    n = scores_B.shape[0]
    flags = _negative_flags(is_negative_B, n)
    on = _on_policy_flags(on_policy_B, n)
    s64 = scores_B.detach().to(torch.float64)
    adv = torch.zeros_like(s64)
    for members in groups.values():
        real, neg = _split(members, flags)
        base = [i for i in real if on is None or on[i]] or real  # no actor member: its own
        if neg:
            adv[neg] = _negative_advantages(s64, base, neg, norm_adv_by_std_in_grpo)
        if not real:
            continue
        s = s64[real]
        if bool((s == s[0]).all()) and len(real) > 1:
            continue  # exactly 0, as GRPO
        mean, scale = _baseline(s64[base], norm_adv_by_std_in_grpo)
        if norm_adv_by_std_in_grpo:
            adv[real] = (s - mean) / (scale + epsilon)
        else:
            adv[real] = s - mean
    return _broadcast(adv, response_mask_BT, scores_B)
