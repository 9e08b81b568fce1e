"""What a run says at its start (what runs, where) and its end (where the outputs are, the best
held-out score, what to open next)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from toolgrpo.trainer.run_dir import read_records

HELD_OUT_KEYS = ("val/all/accuracy", "val/all/reward_mean", "val/reward/mean")


def best_held_out(metrics: list[dict[str, Any]]) -> tuple[str, float, int] | None:
    """The best held-out score and its (earliest) step: accuracy when logged, else mean reward."""
    for key in HELD_OUT_KEYS:
        pts = [(r[key], r.get("step", 0)) for r in metrics if isinstance(r.get(key), (int, float))]
        if pts:
            v, s = max(pts, key=lambda p: (p[0], -p[1]))
            return key, float(v), int(s)
    return None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The step records of ``metrics.jsonl``; torn or edited lines (``[1, 2]``) are skipped."""
    return read_records(path)[0]


def summary_lines(out: Path, history: list[dict[str, Any]], trainer_cfg: Any) -> list[str]:
    """What a user needs after a run, as plain lines (also printed when the run stopped early)."""
    metrics = read_metrics(out / "metrics.jsonl") or history
    q = shlex.quote(str(out))
    lines = [f"outputs: {out}"]
    ckpts = sorted(out.glob("checkpoints/global_step_*"), key=lambda p: p.stat().st_mtime)
    if ckpts:
        lines.append(f"  latest checkpoint: {ckpts[-1]}")
    if (out / "metrics.jsonl").is_file():
        lines.append(f"  metrics: {out / 'metrics.jsonl'}")
    if trainer_cfg.rollout_data_dir:
        lines.append(f"  rollout dumps: {trainer_cfg.rollout_data_dir}")
    best = best_held_out(metrics)
    if best is not None:
        lines.append(f"best held-out {best[0]} = {best[1]:.4g} at step {best[2]}")
    else:
        lines.append("no held-out metrics (set trainer.test_freq or trainer.val_before_train)")
    lines.append(f"report: toolgrpo report {q}  (writes {out / 'report.html'}, opens offline)")
    if "tensorboard" in trainer_cfg.logger:
        lines.append(f"TensorBoard: tensorboard --logdir {shlex.quote(str(out / 'tensorboard'))}")
    return lines


def startup_lines(trainer: Any) -> list[str]:
    """A few lines before the first step: model, rollout backend and dtypes, tasks, steps, and
    where outputs and the library log (run.log) go."""
    cfg, policy = trainer.cfg, trainer.policy
    r = cfg.actor_rollout_ref.rollout
    kind = "LoRA" if policy.is_lora else "full"
    dtype = str(policy.dtype).removeprefix("torch.")
    gen = type(trainer.generator).__name__
    if trainer.pool is not None:
        backend = f"ray ({cfg.trainer.distributed.num_rollout_workers} workers)"
    elif "VLLM" in gen:
        import torch

        from toolgrpo.rollout.vllm_backend import engine_dtype

        backend = f"vllm ({engine_dtype(r.dtype, torch.cuda.is_available())})"
    else:
        backend = "hf"
    steps = trainer.total_steps
    first = f"steps {trainer.step + 1}-{steps}" if trainer.step else f"{steps} step(s)"
    if trainer.step >= steps:
        first = "no step left to train"
    log = getattr(trainer, "run_log", None)
    where = f"outputs: {trainer.out}" + (f"  (library logs: {log.path})" if log else "")
    return [
        f"model: {cfg.actor_rollout_ref.model.path} ({kind}, {dtype} compute), "
        f"rollouts by {backend}",
        f"  {len(trainer.tasks)} tasks, {cfg.data.train_batch_size} per step x {r.n} samples, "
        f"{first}, {cfg.algorithm.adv_estimator}",
        f"  {where}",
        *nothing_left(trainer.step, steps),
    ]


def nothing_left(step: int, total: int) -> list[str]:
    """The line a resume past the last step prints: it trains nothing, and says why."""
    if step < total:
        return []
    return [
        f"nothing left to train: the run is at step {step} of {total} "
        "(trainer.total_training_steps, or the epochs' steps); raise it to train further"
    ]
