"""Learning-rate schedules shared by GRPO and SFT (verl's warmup + constant/cosine)."""

from __future__ import annotations

import math
from typing import Any


def lr_factor(step: int, warmup: int, total: int, o: Any) -> float:
    """Multiplier of the base lr at ``step`` (0-based)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if o.warmup_style == "cosine" and total > warmup:
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        cos = 0.5 * (1 + math.cos(math.pi * progress))
        return o.min_lr_ratio + (1 - o.min_lr_ratio) * cos
    return 1.0
