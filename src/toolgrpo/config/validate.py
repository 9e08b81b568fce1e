"""Checks on values a schema's types cannot express, run before anything heavy starts."""

from __future__ import annotations

import importlib.util
import math
import re
from typing import Any

from toolgrpo.config.loader import ConfigError
from toolgrpo.config.router import check_router_config
from toolgrpo.config.rules import (
    ADV_ESTIMATORS,
    AGG_MODES,
    KL_KINDS,
    SFT_RULES,
    TRAIN_RULES,
    check_rules,
)
from toolgrpo.config.schema import (
    ROLLBACK_MODES,
    MultiTurnConfig,
    RolloutAllocationScheduleConfig,
    RolloutOnlyConfig,
    TrainConfig,
)
from toolgrpo.tools.types import ERROR_TYPES


def _one_of(value: str, allowed: tuple[str, ...], key: str) -> None:
    base = value[:-1] if key.endswith("kl_loss_type") and value.endswith("+") else value
    if base not in allowed:
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}")


def _positive(value: float, key: str) -> None:
    if value <= 0:
        raise ConfigError(f"{key} must be > 0, got {value}")


def validate_train_config(cfg: TrainConfig) -> None:
    """Raise ConfigError naming the key for any setting the trainer cannot honour."""
    check_rules(cfg, TRAIN_RULES)  # every number's range and every name's choices
    for b in ("wandb", "mlflow"):  # optional trackers: a missing extra fails before the model
        if b in cfg.trainer.logger and importlib.util.find_spec(b) is None:
            raise ConfigError(
                f"trainer.logger={b} needs the {b} package: pip install 'toolgrpo[{b}]'"
            )
    d, a, r, alg = (
        cfg.data,
        cfg.actor_rollout_ref.actor,
        cfg.actor_rollout_ref.rollout,
        cfg.algorithm,
    )
    _one_of(alg.adv_estimator, ADV_ESTIMATORS, "algorithm.adv_estimator")
    _one_of(a.loss_agg_mode, AGG_MODES, "actor_rollout_ref.actor.loss_agg_mode")
    _one_of(a.kl_loss_type, KL_KINDS, "actor_rollout_ref.actor.kl_loss_type")
    _one_of(alg.kl_penalty, KL_KINDS, "algorithm.kl_penalty")
    _one_of(alg.kl_ctrl.type, ("fixed", "adaptive"), "algorithm.kl_ctrl.type")
    _one_of(r.name, ("hf", "vllm", "auto"), "actor_rollout_ref.rollout.name")
    _one_of(r.dtype, ("auto", "bfloat16", "float32"), "actor_rollout_ref.rollout.dtype")
    _one_of(r.mode, ("sync", "async"), "actor_rollout_ref.rollout.mode")
    if any(not isinstance(s, str) or not s for s in r.stop):
        raise ConfigError(
            f"actor_rollout_ref.rollout.stop must be a list of non-empty strings, got {r.stop!r}"
        )
    if r.mode == "async" and r.name == "hf":
        raise ConfigError(
            "actor_rollout_ref.rollout.mode=async runs vLLM's async engine: set "
            "actor_rollout_ref.rollout.name=vllm (or auto), or use mode=sync with hf"
        )
    dist = cfg.trainer.distributed
    _one_of(dist.backend, ("local", "ray"), "trainer.distributed.backend")
    if a.use_torch_compile and dist.strategy == "fsdp2":
        raise ConfigError(
            "actor_rollout_ref.actor.use_torch_compile=true is not supported with "
            "trainer.distributed.strategy=fsdp2 (the sharded update is not compiled): set one"
        )
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", str(cfg.trainer.device)):
        raise ConfigError(
            f"trainer.device must be auto, cpu, cuda or cuda:N, got {cfg.trainer.device!r}"
        )
    if dist.backend == "ray":
        _positive(dist.num_rollout_workers, "trainer.distributed.num_rollout_workers")
        _positive(dist.call_timeout_s, "trainer.distributed.call_timeout_s")
        if dist.max_worker_restarts < 0:
            raise ConfigError("trainer.distributed.max_worker_restarts must be >= 0")

    if r.name in ("vllm", "auto"):
        if r.tensor_model_parallel_size != 1:
            raise ConfigError(
                "actor_rollout_ref.rollout.tensor_model_parallel_size must be 1: the weight push "
                "reloads an in-process engine"
            )
        _positive(r.cpu_kvcache_space_gb, "actor_rollout_ref.rollout.cpu_kvcache_space_gb")
        _positive(r.max_num_seqs, "actor_rollout_ref.rollout.max_num_seqs")
    if r.name == "vllm" and cfg.async_training.enable:
        raise ConfigError(
            "async_training.enable samples from a copy of the HF module on a thread: use "
            "actor_rollout_ref.rollout.name=hf with it"
        )
    _one_of(d.truncation, ("left", "error"), "data.truncation")
    _one_of(d.bad_rows, ("skip", "error"), "data.bad_rows")
    _one_of(cfg.reward.nan_policy, ("error", "zero"), "reward.nan_policy")
    _one_of(cfg.actor_rollout_ref.model.dtype, ("auto", "bfloat16", "float32"), "model.dtype")
    for key, value in [
        ("data.train_batch_size", d.train_batch_size),
        ("data.max_prompt_length", d.max_prompt_length),
        ("data.max_response_length", d.max_response_length),
        ("actor_rollout_ref.rollout.n", r.n),
        ("actor_rollout_ref.rollout.temperature", r.temperature),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", a.ppo_mini_batch_size),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", a.ppo_micro_batch_size_per_gpu),
        ("actor_rollout_ref.actor.ppo_epochs", a.ppo_epochs),
        ("actor_rollout_ref.actor.optim.lr", a.optim.lr),
        ("trainer.total_training_steps", cfg.trainer.total_training_steps),
    ]:
        _positive(value, key)
    if not 0 < r.top_p <= 1:
        raise ConfigError(f"actor_rollout_ref.rollout.top_p must be in (0, 1], got {r.top_p}")
    if a.clip_ratio_c <= 1:
        raise ConfigError("actor_rollout_ref.actor.clip_ratio_c must be > 1")
    if d.train_batch_size % a.ppo_mini_batch_size:
        raise ConfigError(
            f"data.train_batch_size ({d.train_batch_size}) must be a multiple of "
            f"actor_rollout_ref.actor.ppo_mini_batch_size ({a.ppo_mini_batch_size})"
        )
    if alg.adv_estimator in ("grpo", "dr_grpo", "rloo", "grpo_split") and r.n < 2:
        raise ConfigError(
            f"algorithm.adv_estimator={alg.adv_estimator} compares samples within a group: "
            "set actor_rollout_ref.rollout.n >= 2"
        )
    mt = r.multi_turn
    _one_of(
        mt.tool_response_truncate_side,
        ("right", "left", "middle"),
        "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side",
    )
    _positive(mt.max_tokens_per_turn, "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn")
    _check_rollback(mt)
    keeps_negatives = (
        mt.enable_tool_rollback
        and mt.rollback_mode != "fission"
        and mt.max_tool_retries > 0
        and mt.save_negative_samples
        and mt.max_negative_samples_per_group != 0
    )
    if alg.adv_estimator == "gae" and keeps_negatives:
        # A negative's reward is a label, not a return: the critic would learn it as the value
        # of states real episodes also visit, and GAE would bootstrap the real rows from it.
        raise ConfigError(
            "algorithm.adv_estimator=gae cannot train on negative samples (their negative_reward "
            "is not a return the critic should learn): set actor_rollout_ref.rollout.multi_turn."
            "save_negative_samples=false or use grpo, dr_grpo or rloo"
        )
    if cfg.async_training.staleness_threshold < 0:
        raise ConfigError("async_training.staleness_threshold must be >= 0")
    if a.use_kl_loss and alg.use_kl_in_reward:
        raise ConfigError("use either actor.use_kl_loss or algorithm.use_kl_in_reward, not both")
    _check_rollout_only(cfg)
    _check_filter_groups(cfg)
    check_router_config(cfg)
    _check_schema_augmentation(cfg)


def _check_schema_augmentation(cfg: TrainConfig) -> None:
    """Schema augmentation renames tools in multi-turn training episodes only, and the router
    tells tool families apart by their names, so the two do not run together."""
    key = "actor_rollout_ref.rollout.multi_turn."
    if not cfg.actor_rollout_ref.rollout.multi_turn.schema_augmentation.enable:
        return
    if not cfg.actor_rollout_ref.rollout.multi_turn.enable:
        raise ConfigError(f"{key}schema_augmentation needs {key}enable=true (tool episodes)")
    if cfg.router.enable:
        raise ConfigError(
            f"{key}schema_augmentation renames tools, and router.enable=true tells tool families "
            "apart by their names (which tools a route offers, what a call costs): turn one off"
        )


def _check_rollback(mt: MultiTurnConfig) -> None:
    """Tool rollback settings (checked even when off, so a typo surfaces before it is used)."""
    key = "actor_rollout_ref.rollout.multi_turn."
    if mt.enable_tool_rollback and not mt.enable:
        raise ConfigError(f"{key}enable_tool_rollback needs {key}enable=true")
    for name in ("max_tool_retries", "max_negative_samples_per_group"):
        value = getattr(mt, name)
        if value is not None and value < 0:
            raise ConfigError(f"{key}{name} must be >= 0 (or null: no cap), got {value}")
    _one_of(mt.rollback_mode, ROLLBACK_MODES, f"{key}rollback_mode")
    if mt.rollback_mode == "relabel" and not mt.save_negative_samples:
        raise ConfigError(
            f"{key}rollback_mode=relabel trains each relabelled failure only as a negative "
            f"sample: set {key}save_negative_samples=true (or use rollback_mode=retry)"
        )
    if not math.isfinite(mt.negative_reward):
        raise ConfigError(f"{key}negative_reward must be finite, got {mt.negative_reward}")
    for i, pattern in enumerate(mt.rollback_error_patterns):
        try:
            re.compile(pattern)
        except re.error as e:
            raise ConfigError(
                f"{key}rollback_error_patterns[{i}]={pattern!r} is not a valid regex: {e}"
            ) from None
    for t in mt.rollback_error_types:
        _one_of(t, ERROR_TYPES, f"{key}rollback_error_types")


def _check_filter_groups(cfg: TrainConfig) -> None:
    """Dynamic sampling keeps whole groups whose rewards differ: it needs groups, and the
    features that carry per-row state from the sampler into the update do not re-batch."""
    if not cfg.algorithm.filter_groups.enable:
        return
    key = "algorithm.filter_groups.enable=true"
    if cfg.algorithm.adv_estimator == "gae":
        raise ConfigError(f"{key} keeps groups whose rewards differ: use grpo, dr_grpo or rloo")
    for on, what in (
        (cfg.router.enable, "router.enable (each row's route price is bound to its batch)"),
        (cfg.async_training.enable, "async_training.enable (the rollout thread's batches)"),
        (bool(cfg.rollout_only.model_path), "rollout_only.model_path (the mixture's schedule)"),
    ):
        if on:
            raise ConfigError(f"{key} does not run with {what} yet: turn one off")


def _check_rollout_only(cfg: TrainConfig) -> None:
    """The fixed rollout policy's settings and its allocation schedule."""
    ro = cfg.rollout_only
    if not ro.model_path:
        for section, default in (
            ("rollout_only", RolloutOnlyConfig()),
            ("rollout_allocation_schedule", RolloutAllocationScheduleConfig()),
        ):
            if getattr(cfg, section) != default:
                raise ConfigError(
                    f"{section} settings are given but rollout_only.model_path is empty: name the "
                    f"fixed policy's model (HF dir, .gguf or alias) or drop the {section} settings"
                )
        return
    from toolgrpo.mixture.schedule import build_schedule  # the schedule checks its own settings

    build_schedule(cfg.rollout_allocation_schedule, cfg.trainer.seed)
    if ro.dtype is not None:
        _one_of(ro.dtype, ("auto", "bfloat16", "float32"), "rollout_only.dtype")
    if ro.generation_batch_size is not None:
        _positive(ro.generation_batch_size, "rollout_only.generation_batch_size")
    entries = [("rollout_only", ro)] + [
        (f"rollout_only.extra_policies[{i}]", e) for i, e in enumerate(ro.extra_policies)
    ]
    for key, e in entries:
        if e.temperature is not None:
            _positive(e.temperature, f"{key}.temperature")
        if e.top_p is not None and not 0 < e.top_p <= 1:
            raise ConfigError(f"{key}.top_p must be in (0, 1], got {e.top_p}")
        if e.top_k is not None and e.top_k < -1:
            raise ConfigError(f"{key}.top_k must be >= -1 (-1 = off), got {e.top_k}")
        if not (math.isfinite(e.weight) and e.weight >= 0):
            raise ConfigError(f"{key}.weight must be >= 0, got {e.weight}")
    if sum(e.weight for _, e in entries) <= 0:
        raise ConfigError("the fixed policies' weights (rollout_only.weight, ...) sum to 0")
    if ro.fixed_loss == "shaped" and ro.bypass_mode:
        raise ConfigError(
            "rollout_only.fixed_loss=shaped trains fixed rows without PPO's old log-probs: "
            "rollout_only.bypass_mode=true has nothing to bypass (set it false)"
        )
    if not ro.fixed_kl_loss and cfg.algorithm.use_kl_in_reward:
        raise ConfigError(
            "rollout_only.fixed_kl_loss=false keeps fixed rows out of the KL loss only: "
            "algorithm.use_kl_in_reward would still charge them (use actor.use_kl_loss)"
        )
    if cfg.rollout_allocation_schedule.groups == "mixed" and cfg.router.enable:
        raise ConfigError(
            "rollout_allocation_schedule.groups=mixed cannot run with router.enable: the router "
            "samples one route per rollout of whole groups (use groups=whole)"
        )
    if ro.bypass_mode and cfg.algorithm.use_kl_in_reward:
        raise ConfigError(
            "algorithm.use_kl_in_reward would charge fixed-policy rows the fixed policy's KL "
            "under rollout_only.bypass_mode=true: use actor.use_kl_loss or bypass_mode=false"
        )


def validate_sft_config(cfg: Any) -> None:
    """Raise ConfigError naming the key for any ``toolgrpo sft`` setting out of range."""
    check_rules(cfg, SFT_RULES)
