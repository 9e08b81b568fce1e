"""Learning-rate schedules shared by GRPO and SFT (verl's warmup + constant/cosine)."""

from __future__ import annotations

import math
from typing import Any

import torch


def lr_factor(step: int, warmup: int, total: int, o: Any) -> float:
    """Multiplier of the base lr at ``step`` (0-based)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if o.warmup_style == "cosine" and total > warmup:
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        cos = 0.5 * (1 + math.cos(math.pi * progress))
        return o.min_lr_ratio + (1 - o.min_lr_ratio) * cos
    return 1.0


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float | None) -> torch.Tensor:
    """The gradients' total norm, after scaling them to at most ``max_norm`` (None = no clip).

    Refuses ``max_norm <= 0`` or non-finite (a config that skipped validation): torch scales by
    ``max_norm / norm``, so -1 turns the update into gradient ascent and 0 erases it.
    """
    if max_norm is None:
        return torch.nn.utils.clip_grad_norm_(params, math.inf)
    if not (isinstance(max_norm, (int, float)) and math.isfinite(max_norm) and max_norm > 0):
        raise ValueError(f"grad_clip must be a finite number > 0 (or null), got {max_norm!r}")
    return torch.nn.utils.clip_grad_norm_(params, max_norm)
