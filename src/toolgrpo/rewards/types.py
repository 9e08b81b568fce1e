"""Small value types shared by the reward functions (RLLA reward parts and flags)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["RewardParts", "RllaFlags"]


class RewardParts(NamedTuple):
    """The RLLA reward split into parts; unpacks as ``(total, format, correctness, length)``.

    ``total`` is always ``format + correctness + length`` (in that order of addition).
    ``length`` is the integer ``0`` when the length reward is off, as in ToolRL.
    """

    total: float
    format: float
    correctness: float
    length: float


@dataclass(frozen=True)
class RllaFlags:
    """ToolRL's reward switches. ``None`` means "read the env var of the same name, upper-cased".

    Only the exact string ``"1"`` turns an env var on (as in ToolRL); an explicit ``True`` or
    ``False`` here always wins over the environment.
    """

    withlength: bool | None = None  # WITHLENGTH
    schedulelength: bool | None = None  # SCHEDULELENGTH
    correctmax1: bool | None = None  # CORRECTMAX1
    max1step30max3: bool | None = None  # MAX1STEP30MAX3
    schedulereward: bool | None = None  # SCHEDULEREWARD
    refinedreward: bool | None = None  # REFINEDREWARD
    intermediatereward: bool | None = None  # INTERMEDIATEREWARD
    coarsereward: bool | None = None  # COARSEREWARD

    def resolve(self, environ: Mapping[str, str] | None = None) -> RllaFlags:
        """Return a copy with every ``None`` replaced by its env var (``os.environ`` by default)."""
        env = os.environ if environ is None else environ
        values: dict[str, bool] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None:
                value = env.get(field.name.upper()) == "1"
            values[field.name] = bool(value)
        return RllaFlags(**values)
