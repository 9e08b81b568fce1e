"""The pure parts of ``vs_trl.py``: toolgrpo config → TRL ``GRPOConfig`` arguments, per-step rows
from each side's logs, and the summary; plus a subprocess runner that measures peak RSS.

Kept apart so a unit test can check the mapping and the arithmetic without TRL installed.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TRL_VERSION = "1.16.0"  # the newest TRL on PyPI at writing; works with torch 2.13.0 (CPU)

# Measured before this script existed (issue #19): TRL 1.16 at the RLLA job's settings was killed
# for memory at 23.6 GB with 16 completions per forward, and took 240-440 s a step at 17 GB with
# micro-batches of 4. So TRL gets micro-batches of 4 (gradient accumulation over the 16) and
# its own default memory lever, gradient checkpointing.
TRL_MEMORY_NOTE = (
    "TRL needs micro-batches to fit in 24 GiB: per_device_train_batch_size=4 completions per "
    "forward, gradient_accumulation_steps=(prompts x n)/4, generation_batch_size=prompts x n "
    "(one generate call, one optimizer step per toolgrpo step), gradient_checkpointing on. "
    "Earlier: 16 completions per forward was killed at 23.6 GB; micro-batches of 4 peaked at 17 GB."
)
DEFAULT_TRL_MICRO_BATCH = 4

# loss_agg_mode -> TRL loss_type with the same normalisation
_LOSS_TYPES = {
    "token-mean": "dapo",  # sum over tokens / tokens in the whole (accumulated) batch
    "seq-mean-token-mean": "grpo",
    "seq-mean-token-sum-norm": "dr_grpo",
}


class MappingError(ValueError):
    """A toolgrpo setting TRL's GRPOTrainer has no equivalent for (the comparison would lie)."""


def trl_grpo_args(
    cfg: Any,
    dtype: str,
    steps: int,
    output_dir: str,
    micro_batch: int = DEFAULT_TRL_MICRO_BATCH,
    gradient_checkpointing: bool = True,
) -> dict[str, Any]:
    """``GRPOConfig`` keyword arguments for the run ``cfg`` (a toolgrpo ``TrainConfig``) describes:
    same group size, lengths, sampling, optimiser, clip, loss normalisation and dtype; one TRL
    optimizer step per toolgrpo step. ``dtype`` is the resolved compute dtype name."""
    d, a = cfg.data, cfg.actor_rollout_ref
    actor, r, alg = a.actor, a.rollout, cfg.algorithm
    if alg.adv_estimator not in ("grpo", "dr_grpo"):
        raise MappingError(
            f"algorithm.adv_estimator={alg.adv_estimator} has no TRL GRPO equivalent"
        )
    if actor.loss_agg_mode not in _LOSS_TYPES:
        raise MappingError(f"actor.loss_agg_mode={actor.loss_agg_mode} has no TRL loss_type")
    if actor.entropy_coeff != 0 or actor.policy_loss.loss_mode != "vanilla":
        raise MappingError("only the vanilla clipped loss without entropy bonus is mapped")
    if alg.use_kl_in_reward or (actor.use_kl_loss and actor.kl_loss_type != "low_var_kl"):
        raise MappingError("TRL's KL is a k3 (low_var_kl) loss term; other KL settings differ")
    if actor.ppo_mini_batch_size != d.train_batch_size:
        raise MappingError(
            "actor.ppo_mini_batch_size must equal data.train_batch_size (one optimizer step a step)"
        )
    completions = d.train_batch_size * r.n
    if completions % micro_batch:
        raise MappingError(f"{completions} completions a step do not split into {micro_batch}s")
    if dtype not in ("float32", "bfloat16"):
        raise MappingError(f"dtype {dtype} is not compared (float32 or bfloat16)")
    std = alg.norm_adv_by_std_in_grpo and alg.adv_estimator == "grpo"
    o = actor.optim
    return {
        "output_dir": output_dir,
        "max_steps": steps,
        "num_generations": r.n,
        "per_device_train_batch_size": micro_batch,
        "gradient_accumulation_steps": completions // micro_batch,
        "generation_batch_size": completions,
        "num_iterations": actor.ppo_epochs,
        "max_completion_length": d.max_response_length,
        "temperature": r.temperature,
        "top_p": r.top_p,
        "top_k": max(r.top_k, 0),  # toolgrpo -1 = off, TRL 0 = off
        "learning_rate": o.lr,
        "weight_decay": o.weight_decay,
        "adam_beta1": o.betas[0],
        "adam_beta2": o.betas[1],
        "lr_scheduler_type": "constant_with_warmup" if o.lr_warmup_steps else "constant",
        "warmup_steps": o.lr_warmup_steps,
        "max_grad_norm": actor.grad_clip or 0.0,  # 0 = no clipping in HF Trainer
        "epsilon": actor.clip_ratio_low if actor.clip_ratio_low is not None else actor.clip_ratio,
        "epsilon_high": (
            actor.clip_ratio_high if actor.clip_ratio_high is not None else actor.clip_ratio
        ),
        "beta": actor.kl_loss_coef if actor.use_kl_loss else 0.0,
        "loss_type": _LOSS_TYPES[actor.loss_agg_mode],
        "scale_rewards": "group" if std else "none",
        "bf16": dtype == "bfloat16",
        "fp16": False,
        "use_cpu": True,
        "gradient_checkpointing": gradient_checkpointing,
        "seed": cfg.trainer.seed,
        "shuffle_dataset": False,  # the JSONL is already in toolgrpo's sampling order
        "disable_dropout": True,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "dataloader_num_workers": 0,
        "remove_unused_columns": False,
    }


@dataclass
class StepRow:
    """One training step of either system; ``update_s`` is everything but generation."""

    step: int
    step_s: float
    gen_s: float
    gen_tokens: float
    prompt_tokens: float
    extra: dict[str, float] = field(default_factory=dict)
    reward_mean: float | None = None  # the same RLLA reward on both sides: a sanity check

    @property
    def update_s(self) -> float:
        return max(self.step_s - self.gen_s, 0.0)


def toolgrpo_steps(metrics_jsonl: Path) -> list[StepRow]:
    """Rows from a toolgrpo run's ``metrics.jsonl`` (validation-only lines have no step time)."""
    rows = []
    for line in Path(metrics_jsonl).read_text().splitlines():
        m = json.loads(line)
        if "timing/step_s" not in m:
            continue
        rows.append(
            StepRow(
                step=int(m["step"]),
                step_s=m["timing/step_s"],
                gen_s=m["timing/gen_s"],
                gen_tokens=m["tokens/generated"],
                prompt_tokens=m.get("prompt_length/mean", 0.0) * m.get("batch/size", 0.0),
                extra={
                    k: m[k]
                    for k in ("timing/reward_s", "timing/logprob_s", "timing/train_s")
                    if k in m
                },
                reward_mean=m.get("reward/mean"),
            )
        )
    return rows


def trl_steps(timings_jsonl: Path) -> list[StepRow]:
    """Rows from the TRL runner's per-step timing file (``vs_trl_runner.py`` writes it)."""
    rows = []
    for line in Path(timings_jsonl).read_text().splitlines():
        m = json.loads(line)
        rows.append(
            StepRow(
                step=int(m["step"]),
                step_s=m["step_s"],
                gen_s=m["gen_s"],
                gen_tokens=m["gen_tokens"],
                prompt_tokens=m["prompt_tokens"],
                extra={"score_s": m.get("gen_and_score_s", m["gen_s"]) - m["gen_s"]},
                reward_mean=m.get("reward_mean"),
            )
        )
    return rows


@dataclass
class RunResult:
    """One subprocess run of one system."""

    system: str
    round: int
    returncode: int
    wall_s: float
    peak_rss_gb: float
    steps: list[StepRow] = field(default_factory=list)
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for s, row in zip(out["steps"], self.steps, strict=True):
            s["update_s"] = row.update_s
        return out


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarize(runs: list[RunResult], warmup_steps: int = 1) -> dict[str, dict[str, float]]:
    """Medians per system over every successful run's steps after ``warmup_steps`` (each run
    pays one-off costs in its first steps); a run with only warm-up steps counts them all."""
    out: dict[str, dict[str, float]] = {}
    for system in dict.fromkeys(r.system for r in runs):
        mine = [r for r in runs if r.system == system]
        ok = [r for r in mine if r.returncode == 0 and r.steps]
        rows = [s for r in ok for s in (r.steps[warmup_steps:] or r.steps)]
        step_s = _median([s.step_s for s in rows])
        gen_s = _median([s.gen_s for s in rows])
        gen_tokens = _median([s.gen_tokens for s in rows])
        out[system] = {
            "runs_ok": float(len(ok)),
            "runs_failed": float(len(mine) - len(ok)),
            "steps_measured": float(len(rows)),
            "step_s": step_s,
            "gen_s": gen_s,
            "update_s": _median([s.update_s for s in rows]),
            "gen_tokens": gen_tokens,
            "gen_tokens_per_s": _median([s.gen_tokens / s.gen_s for s in rows if s.gen_s > 0]),
            "step_tokens_per_s": _median(
                [(s.gen_tokens + s.prompt_tokens) / s.step_s for s in rows if s.step_s > 0]
            ),
            "reward_mean": _median([s.reward_mean for s in rows if s.reward_mean is not None]),
            "peak_rss_gb": max((r.peak_rss_gb for r in mine), default=float("nan")),
        }
    return out


def ratios(summary: dict[str, dict[str, float]], baseline: str = "trl") -> dict[str, float]:
    """Each toolgrpo variant's median step time over the baseline's (< 1 = toolgrpo faster)."""
    base = summary.get(baseline, {}).get("step_s", float("nan"))
    return {
        f"{name}/{baseline}": s["step_s"] / base if base and base == base else float("nan")
        for name, s in summary.items()
        if name != baseline
    }


def _tree_rss(proc: Any) -> int:
    """RSS in bytes of a process and all its descendants (vLLM or Ray may start helpers)."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except Exception:  # a helper that exited between listing and reading
            pass
    return total


def run_measured(
    cmd: list[str], env: dict[str, str], log_path: Path, poll_s: float = 0.5
) -> tuple[int, float, float]:
    """Run ``cmd`` (output to ``log_path``); returns (return code, wall seconds, peak RSS GB):
    the larger of the child's own ``ru_maxrss`` and its process tree's polled RSS sum."""
    import psutil

    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        proc = psutil.Process(p.pid)
        peak = 0
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            try:
                peak = max(peak, _tree_rss(proc))
            except psutil.NoSuchProcess:
                pass
            time.sleep(poll_s)
        p.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen.wait
    peak = max(peak, usage.ru_maxrss * 1024)  # Linux reports KiB
    return p.returncode, time.perf_counter() - t0, peak / 1024**3


def log_tail(path: Path, lines: int = 3) -> str:
    """The last lines of a run's log, for the JSON's error field."""
    try:
        return " | ".join(Path(path).read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""
