"""Scoring a policy on held-out tasks: mean reward parts, format rate, exact-call rate."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from toolgrpo import progress
from toolgrpo.config.schema import TrainConfig
from toolgrpo.data.loader import DataError
from toolgrpo.data.task import Task
from toolgrpo.rewards.scoring import Score, score, supports
from toolgrpo.rewards.types import RllaFlags
from toolgrpo.rollout.generator import Completion, Generator, SamplingParams
from toolgrpo.rollout.single_turn import rollout_tasks, solution_text
from toolgrpo.trainer.rollout_dump import RolloutDumper, completion_record


def val_sampling_params(cfg: TrainConfig) -> SamplingParams:
    """Evaluation sampling from ``actor_rollout_ref.rollout.val_kwargs`` (greedy by default)."""
    vk = cfg.actor_rollout_ref.rollout.val_kwargs
    return SamplingParams(
        n=vk.n,
        temperature=vk.temperature if vk.do_sample else 1.0,
        top_p=vk.top_p,
        top_k=vk.top_k,
        max_new_tokens=cfg.data.max_response_length,
        do_sample=vk.do_sample,
        stop=tuple(cfg.actor_rollout_ref.rollout.stop),
    )


def check_scorable(tasks: Sequence[Task], files: Sequence[str], hint: str) -> None:
    """Single-turn scoring knows RLLA rows only: refuse others before any generation."""
    other = sorted({t.task_type for t in tasks if not supports(t.data_source)})
    if other:
        raise DataError(
            f"{', '.join(files)} holds {', '.join(other)} tasks, which single-turn scoring "
            f"cannot score (RLLA rows only): {hint}"
        )


@dataclass
class EvalResult:
    num_tasks: int
    num_samples: int
    reward_mean: float
    format_mean: float
    correctness_mean: float
    length_mean: float
    format_rate: float
    exact_call_rate: float  # over samples whose ground truth calls tools
    response_length_mean: float
    seconds: float
    samples: list[dict[str, Any]] = field(default_factory=list)

    def metrics(self, prefix: str = "val") -> dict[str, float]:
        return {
            f"{prefix}/reward/mean": self.reward_mean,
            f"{prefix}/reward/format/mean": self.format_mean,
            f"{prefix}/reward/correctness/mean": self.correctness_mean,
            f"{prefix}/format_rate": self.format_rate,
            f"{prefix}/exact_call_rate": self.exact_call_rate,
            f"{prefix}/num_tasks": float(self.num_tasks),
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(
    tasks: Sequence[Task], completions: Sequence[Completion], scores: Sequence[Score], n: int
) -> dict[str, float]:
    """Aggregate per-sample scores (completions are grouped n per task)."""
    k = max(len(scores), 1)
    tool_rows = [s for s in scores if s.exact_call is not None]
    return {
        "reward_mean": sum(s.total for s in scores) / k,
        "format_mean": sum(s.format for s in scores) / k,
        "correctness_mean": sum(s.correctness for s in scores) / k,
        "length_mean": sum(s.length for s in scores) / k,
        "format_rate": sum(s.format_ok for s in scores) / k,
        "exact_call_rate": sum(bool(s.exact_call) for s in tool_rows) / max(len(tool_rows), 1),
        "response_length_mean": sum(len(c.token_ids) for c in completions) / k,
    }


def evaluate(
    generator: Generator,
    tokenizer: Any,
    tasks: Sequence[Task],
    params: SamplingParams,
    max_prompt_length: int,
    step: int = 0,
    flags: RllaFlags | None = None,
    keep_samples: int = 0,
    batch_size: int = 16,
    dumper: RolloutDumper | None = None,
) -> EvalResult:
    """Generate ``params.n`` samples per task and score them with the task's reward."""
    t0 = time.time()
    completions: list[Completion] = []
    for s in range(0, len(tasks), batch_size):
        chunk = tasks[s : s + batch_size]
        completions.extend(rollout_tasks(generator, tokenizer, chunk, params, max_prompt_length))
        progress.tick(len(chunk) * params.n)
    owners = [t for t in tasks for _ in range(params.n)]
    scores = [
        score(t, solution_text(tokenizer, c), step, flags)
        for t, c in zip(owners, completions, strict=True)
    ]
    if dumper is not None:  # trainer.rollout_data_dir: the samples as step <step>'s dump
        rows = zip(completions, owners, scores, strict=True)
        dumper.write(
            step,
            [
                completion_record(c, t, f"{t.task_id}", s, tokenizer, "actor", None)
                for c, t, s in rows
            ],
        )
    samples = [
        {
            "task_id": t.task_id,
            "response": tokenizer.decode(c.token_ids, skip_special_tokens=True),
            **asdict(s),
        }
        for t, c, s in list(zip(owners, completions, scores, strict=True))[:keep_samples]
    ]
    return EvalResult(
        num_tasks=len(tasks),
        num_samples=len(scores),
        seconds=time.time() - t0,
        samples=samples,
        **summarize(tasks, completions, scores, params.n),
    )
