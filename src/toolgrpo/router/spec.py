"""What shapes a route's prompt, saved with the head in ``router.pt``: the family of every tool
(heuristic, label families and ``router.families_file`` already applied), ``family_tools_only``
and the cost model. Evaluation rebuilds the training run's prompts from it; a resume whose own
prompts would differ is refused, since the head learned what the old prompts did."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from toolgrpo.errors import UserError
from toolgrpo.router.families import FamilyMap
from toolgrpo.router.usage import CostModel

SPEC_KEY = "prompts"


class RouterMismatch(UserError):
    """A checkpoint's router was trained with other route prompts, or another head (routes,
    pooling, inputs...), than this run builds: refused in one line."""


def prompt_spec(families: FamilyMap, family_tools_only: bool, cost: CostModel) -> dict[str, Any]:
    names = set(families.known) | set(families.overrides)
    return {
        "families": {n: families.family(n) for n in sorted(names)},
        "family_tools_only": bool(family_tools_only),
        "cost": asdict(cost),
    }


def families_from_spec(spec: Mapping[str, Any]) -> FamilyMap:
    """The training run's families; tools it never saw fall back to the heuristic."""
    return FamilyMap(overrides={str(k): str(v) for k, v in dict(spec["families"]).items()})


def check_spec(saved: Mapping[str, Any] | None, current: Mapping[str, Any], where: str) -> None:
    """Refuse (one line) when the route prompts of this run differ from the checkpoint's: another
    ``family_tools_only``, or a tool both runs know placed in another family."""
    if not saved:
        return  # a router.pt from before the prompts were saved: nothing to compare
    if bool(saved.get("family_tools_only")) != bool(current["family_tools_only"]):
        raise RouterMismatch(
            f"{where}: the router was trained with router.family_tools_only="
            f"{saved.get('family_tools_only')}, this run has {current['family_tools_only']}; "
            "route prompts would differ (set it back, or start a new run)"
        )
    old, new = dict(saved.get("families", {})), dict(current["families"])
    moved = sorted(n for n in set(old) & set(new) if old[n] != new[n])
    if moved:
        shown = ", ".join(f"{n!r} {old[n]} -> {new[n]}" for n in moved[:3])
        more = f" and {len(moved) - 3} more" if len(moved) > 3 else ""
        raise RouterMismatch(
            f"{where}: the router was trained with other tool families ({shown}{more}); route "
            "prompts would differ: restore router.families_file / router.label_file as they "
            "were, or start a new run"
        )
