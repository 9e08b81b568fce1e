"""Every number and name of the configs is range-checked at load (issue 15, items 5 and 6).

Before these rules ``actor.grad_clip=-1`` (gradient ascent), ``warmup_style=linear`` (silently
constant), a NaN learning rate, ``lora_rank=-1``, ``top_k=-2``, ``num_threads=-1``, ``gamma=1.5``
and an unknown logger (refused only after the model loaded) all passed validation.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from toolgrpo.config.loader import ConfigError, load_config
from toolgrpo.config.rules import DELEGATED, FREE_KEYS, SFT_RULES, TRAIN_RULES
from toolgrpo.config.schema import TrainConfig
from toolgrpo.config.validate import validate_sft_config, validate_train_config
from toolgrpo.sft.config import SFTConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."

BAD_TRAIN = [
    (A + "grad_clip", "-1"),  # gradient ascent (cosine -0.99997 with the grad_clip=1 update)
    (A + "grad_clip", "0"),  # zeroes every gradient
    (A + "grad_clip", "nan"),
    (A + "grad_clip", "inf"),
    (A + "optim.lr", "nan"),
    (A + "optim.lr", "inf"),
    (A + "optim.lr", "-1e-6"),
    (A + "optim.lr", "0"),
    (A + "optim.weight_decay", "-0.1"),
    (A + "optim.betas", "[0.9, 1.5]"),
    (A + "optim.lr_warmup_steps", "-1"),
    (A + "optim.warmup_style", "linear"),  # ran as constant
    (A + "optim.min_lr_ratio", "2"),
    (A + "clip_ratio", "-0.2"),
    (A + "clip_ratio_low", "-0.1"),
    (A + "clip_ratio_high", "-0.3"),
    (A + "clip_ratio_c", "1"),
    (A + "clip_ratio_c", "nan"),
    (A + "entropy_coeff", "nan"),
    (A + "kl_loss_coef", "-0.001"),
    (A + "kl_loss_type", "kl3"),
    (A + "policy_loss.loss_mode", "clipped"),
    (A + "ppo_epochs", "0"),
    (A + "ppo_micro_batch_size_per_gpu", "0"),
    (A + "logprob_chunk_size", "0"),
    ("actor_rollout_ref.model.lora_rank", "-1"),
    ("actor_rollout_ref.model.lora_alpha", "0"),
    ("actor_rollout_ref.model.lora_dropout", "1"),
    ("actor_rollout_ref.model.dtype", "fp16"),
    (R + "top_k", "-2"),
    (R + "top_p", "1.5"),
    (R + "temperature", "-1"),
    (R + "temperature", "nan"),
    (R + "n", "0"),
    (R + "generation_batch_size", "0"),
    (R + "log_prob_micro_batch_size_per_gpu", "0"),
    (R + "val_kwargs.temperature", "-0.5"),
    (R + "val_kwargs.top_p", "0"),
    (R + "val_kwargs.top_k", "-5"),
    (R + "val_kwargs.n", "0"),
    (R + "gpu_memory_utilization", "1.5"),
    (R + "max_model_len", "-1"),
    (R + "multi_turn.max_tool_response_length", "-1"),
    (R + "multi_turn.max_concurrent_episodes", "-1"),
    (R + "multi_turn.error_reward", "nan"),
    (R + "multi_turn.tool_response_truncate_side", "center"),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "0"),
    ("data.val_batch_size", "0"),
    ("data.max_prompt_length", "0"),
    ("data.max_response_length", "-8"),
    ("data.max_samples", "0"),
    ("data.val_max_samples", "-3"),
    ("data.seed", "-1"),
    ("data.truncation", "right"),
    ("algorithm.gamma", "1.5"),
    ("algorithm.lam", "-0.1"),
    ("algorithm.kl_penalty", "kll"),
    ("algorithm.kl_ctrl.type", "adaptiv"),
    ("algorithm.kl_ctrl.kl_coef", "-1"),
    ("algorithm.kl_ctrl.target_kl", "0"),
    ("algorithm.kl_ctrl.horizon", "0"),
    ("critic.lr", "nan"),
    ("critic.vf_coef", "-0.5"),
    ("critic.cliprange_value", "0"),
    ("trainer.num_threads", "-1"),
    ("trainer.total_epochs", "0"),
    ("trainer.save_freq", "-2"),
    ("trainer.test_freq", "-5"),
    ("trainer.max_checkpoints", "-1"),
    ("trainer.seed", "-7"),
    ("trainer.logger", "[console, comet]"),  # refused only after the model loaded
    ("trainer.warn_no_signal_steps", "-1"),
    ("trainer.distributed.num_cpus_per_worker", "0"),
    ("async_training.staleness_threshold", "-1"),
    ("rollout_allocation_schedule.ema", "0"),
    ("rollout_only.rollout_is", "seq"),
    ("rollout_only.rollout_is_threshold", "0"),
    ("rollout_allocation_schedule.initial_policy", "teacher"),
    ("rollout_only.top_k", "-3"),
]


def _train(*overrides: str) -> TrainConfig:
    return load_config(TrainConfig, None, list(overrides))


@pytest.mark.parametrize(("key", "value"), BAD_TRAIN)
def test_bad_train_value_is_refused_naming_the_key(key, value):
    cfg = _train(f"{key}={value}")  # the type is fine; the value is not
    with pytest.raises(ConfigError) as ei:
        validate_train_config(cfg)
    assert key in str(ei.value) and "\n" not in str(ei.value)


BAD_SFT = [
    ("optim.warmup_style", "linear"),
    ("optim.lr", "nan"),
    ("optim.lr", "0"),
    ("model.lora_rank", "-4"),
    ("data.target", "thought"),
    ("data.max_length", "0"),
    ("data.train_batch_size", "0"),
    ("data.micro_batch_size_per_gpu", "0"),
    ("trainer.grad_clip", "-1"),
    ("trainer.grad_clip", "0"),
    ("trainer.num_threads", "-2"),
    ("trainer.total_training_steps", "0"),
    ("trainer.logger", "[comet]"),
]


@pytest.mark.parametrize(("key", "value"), BAD_SFT)
def test_bad_sft_value_is_refused_naming_the_key(key, value):
    cfg = load_config(SFTConfig, None, [f"{key}={value}"])
    with pytest.raises(ConfigError) as ei:
        validate_sft_config(cfg)
    assert key in str(ei.value)


@pytest.mark.parametrize(
    ("override", "suggestion"),
    [
        (A + "optim.warmup_style=cosin", "'cosine'"),
        ("algorithm.adv_estimator=grp", "'grpo'"),
        ("trainer.logger=[consol]", "'console'"),
        (A + "loss_agg_mode=token_mean", "'token-mean'"),
        ("router.pooling=mena", "'mean'"),
        ("router.cost.mode=family_", "'family'"),
    ],
)
def test_unknown_names_suggest_the_close_one(override, suggestion):
    with pytest.raises(ConfigError, match=f"did you mean {suggestion}"):
        validate_train_config(_train(override))


def test_no_far_fetched_suggestion():
    with pytest.raises(ConfigError) as ei:
        validate_train_config(_train(A + "optim.warmup_style=linear"))
    assert "is not one of constant, cosine" in str(ei.value)
    assert "did you mean" not in str(ei.value)


def test_extra_fixed_policy_top_k_is_checked():
    cfg = _train("rollout_only.model_path=m", "rollout_only.extra_policies=[{top_k: -4}]")
    with pytest.raises(ConfigError, match=r"rollout_only.extra_policies\[0\].top_k"):
        validate_train_config(cfg)


def test_grad_clip_null_disables_clipping_and_is_valid():
    cfg = _train(A + "grad_clip=null")
    validate_train_config(cfg)
    assert cfg.actor_rollout_ref.actor.grad_clip is None
    validate_sft_config(load_config(SFTConfig, None, ["trainer.grad_clip=null"]))


def test_edge_values_that_mean_something_stay_valid():
    validate_train_config(
        _train(
            R + "top_k=-1",
            R + "top_k=0",
            R + "val_kwargs.temperature=0",
            "algorithm.gamma=0",
            "algorithm.lam=1",
            "trainer.save_freq=-1",
            "trainer.test_freq=-1",
            "trainer.max_checkpoints=0",
            "trainer.warn_no_signal_steps=0",
            "data.max_samples=-1",
            A + "optim.warmup_style=cosine",
            A + "kl_loss_type=low_var_kl+",
        )
    )


def _leaves(cls: type, prefix: str = "") -> list[tuple[str, object]]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        d = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(d):
            out += _leaves(type(d), f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", hints[f.name]))
    return out


@pytest.mark.parametrize(("schema", "rules"), [(TrainConfig, TRAIN_RULES), (SFTConfig, SFT_RULES)])
def test_every_number_and_name_has_a_rule(schema, rules):
    """Walks the schema: a new numeric or string key must get a rule (or a stated reason)."""
    missing = []
    for key, tp in _leaves(schema):
        boolean = tp is bool or set(typing.get_args(tp)) == {bool, type(None)}
        if boolean or key in rules or key in FREE_KEYS or key.startswith(DELEGATED):
            continue
        missing.append(f"{key}: {tp}")
    assert not missing, "add these to toolgrpo/config/rules.py:\n" + "\n".join(missing)
    for key in rules:  # and no rule names a key that does not exist
        assert key in {k for k, _ in _leaves(schema)}, key


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load_and_validate(path):
    if path.name.startswith("sft_"):
        validate_sft_config(load_config(SFTConfig, path))
    else:
        validate_train_config(load_config(TrainConfig, path))
