"""``toolgrpo eval``: score the base model, an alias, or a training checkpoint; write JSON."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from toolgrpo import progress, safe_io
from toolgrpo.config.loader import ConfigError, load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.config.validate import validate_train_config
from toolgrpo.data.loader import load_tasks
from toolgrpo.data.task import Task
from toolgrpo.distributed.fsdp import resolve_device
from toolgrpo.envs.plugins import load_run_plugins
from toolgrpo.eval.evaluate import check_scorable, evaluate, val_sampling_params
from toolgrpo.eval.multi_turn import plays_episodes, run_episode_eval
from toolgrpo.models.identity import check_checkpoint_base
from toolgrpo.models.loading import load_policy
from toolgrpo.models.registry import resolve_model
from toolgrpo.rewards.scoring import check_task
from toolgrpo.rewards.types import RllaFlags
from toolgrpo.rollout.hf import HFGenerator
from toolgrpo.run_log import RunLog
from toolgrpo.trainer.rollout_dump import make_dumper
from toolgrpo.trainer.run_lock import RunLock, lock_run_dir, refuse_live_run_above


def apply_checkpoint(cfg: TrainConfig, checkpoint: str) -> str:
    """Point the model config at a checkpoint (its merged ``model/``, or its LoRA ``adapter/``)."""
    p = Path(checkpoint)
    m = cfg.actor_rollout_ref.model
    if (p / "model" / "config.json").is_file():
        m.path, m.adapter_path, m.lora_rank = str(p / "model"), "", 0
    elif (p / "adapter" / "adapter_config.json").is_file():
        check_adapter_base(p, m.path)  # an adapter on another base of one shape loads silently
        m.adapter_path = str(p / "adapter")
    elif (p / "config.json").is_file() or (p / "adapter_config.json").is_file():
        m.path, m.adapter_path, m.lora_rank = str(p), "", 0
    else:
        raise FileNotFoundError(f"{p} is neither a checkpoint nor a model directory")
    return str(p)


def check_adapter_base(ckpt: Path, model_path: str) -> None:
    """Refuse an adapter-only checkpoint on a base model other than its own (one line naming
    both); one from before the record is used with a warning."""
    key = "actor_rollout_ref.model.path"
    check_checkpoint_base(ckpt, model_path, resolve_model(model_path).hf_dir, key)


def run_eval(*args: Any, **kwargs: Any) -> int:
    """``toolgrpo eval``, with progress on stderr (bars on a terminal, else a line per phase)."""
    with progress.console_progress("eval"):
        return _run_eval(*args, **kwargs)


@contextmanager
def hold_outputs(out: Path, dump_dir: str, verbose: bool = False) -> Iterator[RunLog]:
    """What eval writes, held as a trainer holds its run directory: the output's folder (and
    the dump folder) locked for this process, so a second eval, or a live trainer's run
    directory, is refused in one line; the libraries' logs go to ``run.log`` beside the
    output, as a training run's do. Checked before the model loads."""
    safe_io.refuse_link(out)
    held = [(out.parent, "--output")] + ([(Path(dump_dir), "--rollout-data-dir")] * bool(dump_dir))
    locks: list[RunLock] = []
    try:
        for where, key in held:  # one folder twice (dumps beside the JSON) is held twice
            refuse_live_run_above(where, key)
            locks.append(lock_run_dir(where, key))
        run_log = RunLog(out.parent, verbose)
        try:
            yield run_log
        finally:
            run_log.close()
    finally:
        for lock in locks:
            lock.release()


def _run_eval(
    config_path: str | None,
    overrides: list[str],
    checkpoint: str | None,
    output: str | None,
    limit: int,
    keep_samples: int,
    rollout_data_dir: str | None = None,
    imports: Sequence[str] = (),
    fit_offset: bool = False,
) -> int:
    cfg = load_config(TrainConfig, config_path, overrides)
    load_run_plugins(cfg, imports)  # --import and trainer.imports: users' env types
    if rollout_data_dir:  # --rollout-data-dir: the same dumps as trainer.rollout_data_dir
        cfg.trainer.rollout_data_dir = rollout_data_dir
    validate_train_config(cfg)
    if cfg.trainer.num_threads > 0:
        import torch

        torch.set_num_threads(cfg.trainer.num_threads)
    label = cfg.actor_rollout_ref.model.path
    if checkpoint:
        label = apply_checkpoint(cfg, checkpoint)
    d = cfg.data
    # Data before the model: a bad file or an unscorable task fails in seconds, not after loading.
    # --limit N: the first N tasks round-robin over the files, as data.val_max_samples takes them
    tasks = load_tasks(d.val_files, d.bad_rows, limit, check_task).tasks
    out = Path(output) if output else Path(cfg.trainer.output_dir) / "eval.json"
    with hold_outputs(out, cfg.trainer.rollout_data_dir, cfg.trainer.verbose) as run_log:
        return _score(cfg, tasks, label, out, keep_samples, checkpoint, run_log, fit_offset)


def _score(
    cfg: TrainConfig,
    tasks: list[Task],
    label: str,
    out: Path,
    keep_samples: int,
    checkpoint: str | None,
    run_log: RunLog,
    fit_offset: bool = False,
) -> int:
    d = cfg.data
    if plays_episodes(cfg, tasks):  # environment tasks: played as episodes (eval/multi_turn.py)
        return run_episode_eval(
            cfg,
            tasks,
            label,
            out,
            keep_samples,
            checkpoint,
            logs=run_log.path,
            fit_offset=fit_offset,
        )
    if fit_offset:
        raise ConfigError("--fit-offset fits a router head's budget offset: it plays episodes")
    check_scorable(tasks, d.val_files, "use an RLLA dataset")
    policy = load_policy(
        cfg.actor_rollout_ref.model, trainable=False, device=resolve_device(cfg.trainer.device)
    )
    params = val_sampling_params(cfg)
    gen = HFGenerator(policy.model, policy.tokenizer, policy.dtype, d.val_batch_size)
    flags = RllaFlags(**vars(cfg.reward.rlla))
    with progress.phase("generation", len(tasks) * params.n, "samples"):
        res = evaluate(
            gen,
            policy.tokenizer,
            tasks,
            params,
            d.max_prompt_length,
            0,
            flags,
            keep_samples,
            d.val_batch_size,
            make_dumper(cfg.trainer),
        )
    record = {"model": label, "val_files": d.val_files, **res.to_dict()}
    safe_io.write_text(out, json.dumps(record, indent=1))
    table = Table(title=f"toolgrpo eval: {label} on {', '.join(d.val_files)}")
    for col in ("tasks", "reward", "format", "correctness", "format rate", "exact-call rate"):
        table.add_column(col)
    table.add_row(
        str(res.num_tasks),
        f"{res.reward_mean:.3f}",
        f"{res.format_mean:.3f}",
        f"{res.correctness_mean:.3f}",
        f"{res.format_rate:.1%}",
        f"{res.exact_call_rate:.1%}",
    )
    Console().print(table)
    print(f"wrote {out}  (library logs: {run_log.path})")
    return 0
