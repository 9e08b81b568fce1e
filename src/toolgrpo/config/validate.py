"""Checks on values a schema's types cannot express, run before anything heavy starts."""

from __future__ import annotations

from toolgrpo.config.loader import ConfigError
from toolgrpo.config.schema import TrainConfig

ADV_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "gae")
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def _one_of(value: str, allowed: tuple[str, ...], key: str) -> None:
    base = value[:-1] if key.endswith("kl_loss_type") and value.endswith("+") else value
    if base not in allowed:
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}")


def _positive(value: float, key: str) -> None:
    if value <= 0:
        raise ConfigError(f"{key} must be > 0, got {value}")


def validate_train_config(cfg: TrainConfig) -> None:
    """Raise ConfigError naming the key for any setting the trainer cannot honour."""
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
    _one_of(r.name, ("hf",), "actor_rollout_ref.rollout.name")
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
    if alg.adv_estimator in ("grpo", "dr_grpo", "rloo") and r.n < 2:
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
    if cfg.async_training.staleness_threshold < 0:
        raise ConfigError("async_training.staleness_threshold must be >= 0")
    if a.use_kl_loss and alg.use_kl_in_reward:
        raise ConfigError("use either actor.use_kl_loss or algorithm.use_kl_in_reward, not both")
