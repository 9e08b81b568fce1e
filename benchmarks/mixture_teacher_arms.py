"""benchmarks/mixture_teacher.py's arms: what each one trains, as ``toolgrpo`` command lines.

The actor is the base SmolLM2-135M (``smollm2-135m``, about 0 % on the environments); the fixed
policy is the agent warm start (``smollm2-135m-agent``, about 38 %). Every RL arm is the agent
main job (configs/agent_smollm2_grpo.yaml) with the overrides below, one batch of 8 tasks a step,
n = 4 actor samples a task, and draws the same number of actor samples (steps × 8 × 4):

- ``actor_only``: GRPO on the actor alone.
- ``design_is``: the design's default: constant α = 0.5 per step, whole groups, fixed rows weighted
  by min(π_old/π_fixed, 2) per sequence; 2 × steps (half the steps are the fixed policy's).
- ``mixed_shaped``: mixed groups (every group: the actor's 4 + 1 fixed sample, GRPO over the 5) and
  LUFFY's policy shaping of the fixed rows (γ = 0.1, r = π/π_fixed).
- ``mixed_shaped_norm``: ``mixed_shaped`` with ``shaping_normalize`` (on request only).
- ``shaped_norm_seq``: ``mixed_shaped`` with ``shaping_normalize``, sequence-mean aggregation
  (``seq-mean-token-mean``: a short teacher success weighs as much as a long actor failure) and
  no KL on the fixed rows (``rollout_only.fixed_kl_loss=false``).
- ``shaped_split``: ``shaped_norm_seq`` with the on-policy baseline (``grpo_split``): the actor's
  rows get 0 in a group only the fixed policy solved.
- ``guided``: ``shaped_split`` plus λ = 1 × NLL on the fixed policy's successes inside the RL step
  (``rollout_only.guided_coef``): the recipe, trained from configs/mixture_teacher.yaml itself
  (``tests/benchmarks`` checks it equals the main job with these overrides).
- ``sft_teacher``: LoRA SFT of the actor (configs/sft_smollm2_agent.yaml) on the fixed policy's
  successful episodes from the ``mixed_shaped`` run of the same seed (its kept dumps), for as many
  examples as that arm had fixed samples.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from cli_runs import IN_HOUSE, ONE_BATCH

from toolgrpo.eval.episodes import success_threshold

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "agent_smollm2_grpo.yaml"
RECIPE = ROOT / "configs" / "mixture_teacher.yaml"
SFT_CONFIG = ROOT / "configs" / "sft_smollm2_agent.yaml"
ACTOR = "smollm2-135m"  # the base: ~0 % on the environments
TEACHER = "smollm2-135m-agent"  # the agent warm start: ~38 %
NEW_ARMS = ("shaped_norm_seq", "shaped_split", "guided")
ARMS = (
    "actor_only",
    "design_is",
    "mixed_shaped",
    "sft_teacher",
    "mixed_shaped_norm",
    *NEW_ARMS,
)
# What a run with no --arms measures: the new arms, with the two they are compared with (both
# measures of one checkpoint each: a kept greedy eval without its pass@4 is trained again).
DEFAULT_ARMS = ("actor_only", *NEW_ARMS, "sft_teacher")
RL_ARMS = tuple(a for a in ARMS if a != "sft_teacher")
STEPS = 16
SFT_BATCH = 8
REFERENCES = {"actor_start": ACTOR, "teacher": TEACHER}

_MIXED_SHAPED = [
    "rollout_allocation_schedule.alpha=0.0",  # every group gets its fixed sample
    "rollout_allocation_schedule.groups=mixed",
    "rollout_allocation_schedule.fixed_per_group=1",
    "rollout_only.fixed_loss=shaped",
    "rollout_only.shaping_gamma=0.1",
]
_NORM_SEQ = [
    "rollout_only.shaping_normalize=true",
    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
    "rollout_only.fixed_kl_loss=false",
]
_SPLIT = ["algorithm.adv_estimator=grpo_split"]
_GUIDED = ["rollout_only.guided_coef=1.0", "rollout_only.guided_min_score=1.0"]
# What each mixture arm adds to the main job (the fixed policy is added to every one of them).
_MIXTURE = {
    "design_is": [
        "rollout_allocation_schedule.type=constant",
        "rollout_allocation_schedule.alpha=0.5",
    ],
    "mixed_shaped": _MIXED_SHAPED,
    "mixed_shaped_norm": [*_MIXED_SHAPED, "rollout_only.shaping_normalize=true"],
    "shaped_norm_seq": [*_MIXED_SHAPED, *_NORM_SEQ],
    "shaped_split": [*_MIXED_SHAPED, *_NORM_SEQ, *_SPLIT],
    "guided": [*_MIXED_SHAPED, *_NORM_SEQ, *_SPLIT, *_GUIDED],
}
# The main job turned into the recipe (configs/mixture_teacher.yaml holds exactly this).
RECIPE_OVERRIDES = [
    f"actor_rollout_ref.model.path={ACTOR}",
    f"rollout_only.model_path={TEACHER}",
    IN_HOUSE,
    ONE_BATCH,
    *_MIXTURE["guided"],
]


def steps_of(arm: str, steps: int) -> int:
    """An RL arm's steps: ``design_is`` doubles them (half of them are the fixed policy's)."""
    return 2 * steps if arm == "design_is" else steps


def config_of(arm: str) -> Path:
    """The config an RL arm trains from: the recipe's own file for ``guided``."""
    return RECIPE if arm == "guided" else CONFIG


def arm_overrides(arm: str, steps: int) -> list[str]:
    """The ``toolgrpo train`` overrides of an RL arm on ``config_of(arm)`` (run and output dirs
    are added later)."""
    common = [
        f"actor_rollout_ref.model.path={ACTOR}",
        f"trainer.total_training_steps={steps_of(arm, steps)}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.rollout_data_samples_per_step=-1",  # every episode: the SFT arm reads them
        IN_HOUSE,
        ONE_BATCH,  # the mixture refuses dynamic sampling
    ]
    if arm == "actor_only":
        return common
    if arm == "guided":  # the recipe's file holds the rest
        return common
    if arm in _MIXTURE:
        return [*common, f"rollout_only.model_path={TEACHER}", *_MIXTURE[arm]]
    raise ValueError(f"{arm} is not an RL arm")


def sft_overrides(data: Path, examples: int, out: Path, seed: int) -> list[str]:
    """``toolgrpo sft`` overrides: LoRA SFT of the actor on ``data`` for ``examples`` examples
    (whole batches; the data repeats when it holds fewer)."""
    return [
        f"data.train_files=[{data}]",
        "data.max_length=2048",  # prompt 1024 + episode 1024, as in RL: nothing dropped
        f"data.train_batch_size={SFT_BATCH}",
        f"data.seed={seed}",
        f"model.path={ACTOR}",
        f"trainer.total_training_steps={max(1, math.ceil(examples / SFT_BATCH))}",
        f"trainer.output_dir={out}",
        f"trainer.seed={seed}",
    ]


def teacher_rows(dump_dir: Path) -> tuple[list[dict[str, Any]], int]:
    """SFT rows (``{"messages": ...}``) of the fixed policy's successful episodes in a run's
    rollout dumps, and how many fixed samples the run drew (rolled-back negatives left out)."""
    rows, fixed = [], 0
    for path in sorted(dump_dir.glob("*.jsonl"), key=lambda p: int(p.stem)):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if r.get("policy", "actor") == "actor" or r.get("negative"):
                continue
            fixed += 1
            reward = r.get("reward")
            if reward is not None and reward >= success_threshold(r["task_type"]):
                rows.append({"messages": r["messages"], "source": f"{r['task_id']}@{r['step']}"})
    return rows, fixed
