"""Value rules for every number and name of the training and SFT configs, as tables by dotted key.

A schema type says "float"; only a rule says "a learning rate is finite and > 0" or "warmup_style
is constant or cosine". ``tests/config/test_rules.py`` walks the schemas, so a new number or name
without a rule here (or a reason in ``FREE_KEYS``/``DELEGATED``) fails the tests.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from toolgrpo.config.loader import ConfigError
from toolgrpo.config.router import (
    COST_MODES,
    FEATURE_NORMS,
    LAGRANGIANS,
    LM_REWARDS,
    POOLINGS,
)
from toolgrpo.config.schema import ROLLBACK_MODES


@dataclass(frozen=True)
class Num:
    """A finite number between ``low`` and ``high`` (strict where ``*_open``), or a listed
    sentinel such as -1 = "all"; ``optional`` allows None (= inherit / off)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    sentinels: tuple[float, ...] = ()
    optional: bool = False

    def describe(self) -> str:
        if self.low is not None and self.high is not None:
            lo, hi = "(" if self.low_open else "[", ")" if self.high_open else "]"
            text = f"in {lo}{self.low:g}, {self.high:g}{hi}"
        elif self.low is not None:
            text = f"{'>' if self.low_open else '>='} {self.low:g}"
        elif self.high is not None:
            text = f"{'<' if self.high_open else '<='} {self.high:g}"
        else:
            text = "a finite number"
        text += "".join(f" or {s:g}" for s in self.sentinels)
        return text + (" or null" if self.optional else "")

    def check(self, key: str, value: Any) -> None:
        if value is None and self.optional:
            return
        if value in self.sentinels:
            return
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and math.isfinite(value)
        if ok and self.low is not None:
            ok = value > self.low if self.low_open else value >= self.low
        if ok and self.high is not None:
            ok = value < self.high if self.high_open else value <= self.high
        if not ok:
            raise ConfigError(f"{key} must be {self.describe()}, got {value!r}")


@dataclass(frozen=True)
class OneOf:
    """A name from a fixed set (or a callable giving the set, for registries filled at import);
    ``each`` checks every item of a list; ``suffix`` is a marker a name may end with."""

    allowed: tuple[str, ...] | Callable[[], Sequence[str]]
    optional: bool = False
    each: bool = False
    suffix: str = ""

    def check(self, key: str, value: Any) -> None:
        if value is None and self.optional:
            return
        allowed = tuple(self.allowed() if callable(self.allowed) else self.allowed)
        for v in value if self.each else [value]:
            name = v[: -len(self.suffix)] if self.suffix and str(v).endswith(self.suffix) else v
            if name in allowed:
                continue
            close = difflib.get_close_matches(str(name), allowed, n=2, cutoff=0.6)
            hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise ConfigError(f"{key}={v!r} is not one of {', '.join(allowed)}{hint}")


@dataclass(frozen=True)
class EachNum:
    """Every item of a list of numbers obeys ``rule``."""

    rule: Num

    def check(self, key: str, value: Any) -> None:
        for i, v in enumerate(value):
            self.rule.check(f"{key}[{i}]", v)


def _policy_losses() -> list[str]:
    from toolgrpo.algos.losses import _POLICY_LOSSES

    return sorted(_POLICY_LOSSES)


def _tool_formats() -> list[str]:
    from toolgrpo.rollout.tool_parsers import FORMATS

    return sorted(FORMATS)


def _error_types() -> tuple[str, ...]:
    from toolgrpo.tools.types import ERROR_TYPES

    return tuple(ERROR_TYPES)


POS = Num(0, low_open=True)  # > 0
NONNEG = Num(0)  # >= 0
FINITE = Num()
UNIT = Num(0, 1)  # [0, 1]
PROB = Num(0, 1, low_open=True)  # (0, 1]: top_p
ALL_OR_POS = Num(1, sentinels=(-1,))  # -1 = all
TOP_K = Num(-1)  # -1 = off (0 is off in HF too)
DTYPES = ("auto", "bfloat16", "float32")
LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")  # the last two: extras
ADV_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "gae", "grpo_split")
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")  # "+" suffix: straight-through
ROLLOUT_IS_LEVELS = ("sequence", "token")  # toolgrpo.mixture.correction (decoupled weights)
FIXED_LOSSES = ("is", "shaped")  # toolgrpo.mixture.correction.OBJECTIVES
SHAPING_RATIOS = ("ratio", "prob")  # toolgrpo.algos.offpolicy
GROUP_MODES = ("whole", "mixed")  # toolgrpo.mixture.groups
MISMATCH_IS_LEVELS = ("token", "sequence")  # toolgrpo.algos.mismatch (rollout correction)
WARMUP_STYLES = ("constant", "cosine")  # toolgrpo.trainer.optim.lr_factor

MODEL_RULES: dict[str, Any] = {
    "dtype": OneOf(DTYPES),
    "lora_rank": NONNEG,
    "lora_alpha": POS,
    "lora_dropout": Num(0, 1, high_open=True),
}
OPTIM_RULES: dict[str, Any] = {
    "lr": POS,
    "weight_decay": NONNEG,
    "betas": EachNum(Num(0, 1, high_open=True)),
    "lr_warmup_steps": NONNEG,
    "warmup_style": OneOf(WARMUP_STYLES),
    "min_lr_ratio": UNIT,
}


def _prefixed(prefix: str, rules: dict[str, Any]) -> dict[str, Any]:
    return {f"{prefix}{k}": v for k, v in rules.items()}


_A = "actor_rollout_ref.actor."
_R = "actor_rollout_ref.rollout."
_MT = _R + "multi_turn."
_RO = "rollout_only."
_S = "rollout_allocation_schedule."

TRAIN_RULES: dict[str, Any] = {
    "data.train_batch_size": POS,
    "data.val_batch_size": POS,
    "data.max_prompt_length": POS,
    "data.max_response_length": POS,
    "data.truncation": OneOf(("left", "error")),
    "data.seed": Num(0, optional=True),  # null = trainer.seed
    "data.bad_rows": OneOf(("skip", "error")),
    "data.max_samples": ALL_OR_POS,
    "data.val_max_samples": ALL_OR_POS,
    **_prefixed("actor_rollout_ref.model.", MODEL_RULES),
    **_prefixed(_A + "optim.", OPTIM_RULES),
    _A + "policy_loss.loss_mode": OneOf(_policy_losses),
    _A + "ppo_mini_batch_size": POS,
    _A + "ppo_micro_batch_size_per_gpu": POS,
    _A + "ppo_epochs": POS,
    _A + "clip_ratio": POS,
    _A + "clip_ratio_low": Num(0, low_open=True, optional=True),
    _A + "clip_ratio_high": Num(0, low_open=True, optional=True),
    _A + "clip_ratio_c": Num(1, low_open=True),  # dual clip: a bound above the ratio 1
    _A + "loss_agg_mode": OneOf(AGG_MODES),
    _A + "entropy_coeff": NONNEG,
    _A + "kl_loss_coef": NONNEG,
    _A + "kl_loss_type": OneOf(KL_KINDS, suffix="+"),
    _A + "grad_clip": Num(0, low_open=True, optional=True),  # null = no clipping
    _A + "logprob_chunk_size": POS,
    _R + "name": OneOf(("hf", "vllm", "auto")),
    _R + "mode": OneOf(("sync", "async")),
    _R + "n": POS,
    _R + "temperature": POS,  # log-probs divide by it
    _R + "top_p": PROB,
    _R + "top_k": TOP_K,
    _R + "log_prob_micro_batch_size_per_gpu": POS,
    _R + "generation_batch_size": POS,
    _R + "val_kwargs.temperature": NONNEG,
    _R + "val_kwargs.top_p": PROB,
    _R + "val_kwargs.top_k": TOP_K,
    _R + "val_kwargs.n": POS,
    _MT + "max_tokens_per_turn": POS,
    _MT + "max_tool_response_length": NONNEG,  # 0 = no limit
    _MT + "tool_response_truncate_side": OneOf(("right", "left", "middle")),
    _MT + "max_concurrent_episodes": NONNEG,  # 0 = all
    _MT + "error_reward": FINITE,
    _MT + "max_tool_retries": NONNEG,
    _MT + "max_negative_samples_per_group": Num(0, optional=True),  # null = no cap
    _MT + "rollback_mode": OneOf(ROLLBACK_MODES),
    _MT + "schema_augmentation.prob": UNIT,
    _MT + "fission_group_size": Num(2),  # a group of one has no baseline
    _MT + "max_fission_forks_per_step": Num(0, optional=True),  # null = no cap
    _MT + "format": OneOf(_tool_formats),  # built in, or registered by a user's module
    _MT + "negative_reward": FINITE,
    _MT + "rollback_error_types": OneOf(_error_types, each=True),
    _MT + "max_env_failure_ratio": UNIT,  # 1 = never stop the run
    _MT + "env_call_timeout_s": NONNEG,  # 0 = no deadline
    _MT + "env_episode_timeout_s": NONNEG,  # 0 = no deadline
    _R + "dtype": OneOf(DTYPES),
    _R + "gpu_memory_utilization": PROB,
    _R + "cpu_kvcache_space_gb": POS,
    _R + "max_num_seqs": POS,
    _R + "max_model_len": NONNEG,  # 0 = prompt + response lengths
    _R + "tensor_model_parallel_size": POS,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": POS,
    "algorithm.adv_estimator": OneOf(ADV_ESTIMATORS),
    "algorithm.gamma": UNIT,
    "algorithm.lam": UNIT,
    "algorithm.kl_penalty": OneOf(KL_KINDS, suffix="+"),
    "algorithm.kl_ctrl.type": OneOf(("fixed", "adaptive")),
    "algorithm.kl_ctrl.kl_coef": NONNEG,
    "algorithm.kl_ctrl.horizon": POS,
    "algorithm.kl_ctrl.target_kl": POS,
    "algorithm.rollout_correction.rollout_is": OneOf(MISMATCH_IS_LEVELS, optional=True),
    "algorithm.rollout_correction.rollout_is_threshold": Num(0, low_open=True, optional=True),
    "algorithm.filter_groups.metric": OneOf(("score",)),
    "algorithm.filter_groups.max_num_gen_batches": Num(-1),  # 0 or -1 = no limit (verl's)
    "critic.vf_coef": NONNEG,
    "critic.cliprange_value": POS,
    "critic.lr": POS,
    "reward.nan_policy": OneOf(("error", "zero")),
    "reward.tool_call_cost": NONNEG,
    "trainer.total_training_steps": POS,
    "trainer.total_epochs": POS,
    "trainer.save_freq": Num(-1),  # -1 (or 0) = only at the end
    "trainer.test_freq": Num(-1),  # -1 (or 0) = never during training
    "trainer.max_checkpoints": NONNEG,  # 0 = keep all
    "trainer.seed": NONNEG,
    "trainer.logger": OneOf(LOGGERS, each=True),
    "trainer.num_threads": NONNEG,  # 0 = torch default
    "trainer.warn_no_signal_steps": NONNEG,  # 0 = never warn
    "trainer.rollout_data_samples_per_step": Num(0, sentinels=(-1,)),  # -1 = all
    "trainer.distributed.backend": OneOf(("local", "ray")),
    "trainer.distributed.num_rollout_workers": POS,
    "trainer.distributed.num_cpus_per_worker": POS,
    "trainer.distributed.call_timeout_s": POS,
    "trainer.distributed.max_worker_restarts": NONNEG,
    "trainer.distributed.strategy": OneOf(("none", "fsdp2")),
    "trainer.distributed.rollout_ranks": OneOf(("auto", "all", "main")),
    "trainer.nnodes": POS,
    "trainer.n_gpus_per_node": NONNEG,
    "async_training.staleness_threshold": NONNEG,
    _RO + "dtype": OneOf(DTYPES, optional=True),
    _RO + "temperature": Num(0, low_open=True, optional=True),
    _RO + "top_p": Num(0, 1, low_open=True, optional=True),
    _RO + "top_k": Num(-1, optional=True),
    _RO + "generation_batch_size": Num(0, low_open=True, optional=True),
    _RO + "weight": NONNEG,
    _RO + "rollout_is": OneOf(ROLLOUT_IS_LEVELS),
    _RO + "rollout_is_threshold": Num(0, low_open=True, optional=True),  # null = untruncated
    _RO + "fixed_loss": OneOf(FIXED_LOSSES),
    _RO + "shaping_gamma": POS,
    _RO + "shaping_ratio": OneOf(SHAPING_RATIOS),
    _RO + "guided_coef": NONNEG,  # 0 = no guided NLL
    _RO + "guided_min_score": FINITE,
    _S + "alpha": UNIT,
    _S + "alpha_0": UNIT,
    _S + "beta": FINITE,
    _S + "max_alpha": UNIT,
    _S + "gamma": NONNEG,
    _S + "initial_policy": OneOf(("actor", "fixed")),
    _S + "seed": Num(0, optional=True),
    _S + "signal": OneOf(("ess", "reward", "ess_or_reward")),
    _S + "ema": PROB,
    _S + "groups": OneOf(GROUP_MODES),
    _S + "fixed_per_group": Num(1),  # k >= 1
    # The router's numbers are checked by config.router.check_router_config; its names here too,
    # for the "did you mean".
    "router.pooling": OneOf(POOLINGS),
    "router.feature_norm": OneOf(FEATURE_NORMS),
    "router.cost.mode": OneOf(COST_MODES),
    "router.lm_reward": OneOf(LM_REWARDS),
    "router.lagrangian": OneOf(LAGRANGIANS),
}

SFT_RULES: dict[str, Any] = {
    "data.target": OneOf(("ground_truth", "output_sft")),
    "data.max_length": POS,
    "data.max_samples": ALL_OR_POS,
    "data.train_batch_size": POS,
    "data.micro_batch_size_per_gpu": POS,
    "data.seed": NONNEG,
    **_prefixed("model.", MODEL_RULES),
    **_prefixed("optim.", OPTIM_RULES),
    "trainer.total_epochs": POS,
    "trainer.total_training_steps": ALL_OR_POS,  # -1 = total_epochs over the data
    "trainer.save_freq": Num(-1),
    "trainer.max_checkpoints": NONNEG,
    "trainer.seed": NONNEG,
    "trainer.grad_clip": Num(0, low_open=True, optional=True),  # null = no clipping
    "trainer.logger": OneOf(LOGGERS, each=True),
    "trainer.num_threads": NONNEG,
}

# Strings that name a path, a model or a run: any value is the user's own.
FREE_KEYS = frozenset(
    {
        "data.train_files",
        "data.val_files",
        "actor_rollout_ref.model.path",
        "actor_rollout_ref.model.target_modules",
        "actor_rollout_ref.model.adapter_path",
        "model.path",
        "model.target_modules",
        "model.adapter_path",
        "trainer.project_name",
        "trainer.experiment_name",
        "trainer.output_dir",
        "trainer.rollout_data_dir",  # a directory; "" = no dumps
        "trainer.resume",  # auto | disable | a checkpoint directory
        "trainer.distributed.address",
        "trainer.device",  # checked in validate.py: auto | cpu | cuda | cuda:N
        "trainer.imports",  # module names or .py paths, imported by envs.plugins.load_plugins
        _R + "stop",  # checked in validate.py: non-empty strings
        _MT + "rollback_error_patterns",  # checked in validate.py: regexes
        _MT + "rollback_error_json_keys",  # any JSON key names
        _MT + "schema_augmentation.task_types",  # checked against the data's (EpisodeRunner)
        _RO + "model_path",
        _RO + "adapter_path",
        _S + "type",  # a registered name or module:Class, checked by mixture.build_schedule
        _S + "switch_steps",  # checked by mixture.schedule.StepSchedule
    }
)
# Sub-trees checked elsewhere: the router (config.router.check_router_config), the user's own
# env options and Ray kwargs, and fixed policies (validate._check_rollout_only).
DELEGATED = (
    "router.",
    _MT + "envs",
    "trainer.distributed.ray_init_kwargs",
    _RO + "extra_policies",
    _S + "params",  # a user schedule's own settings, its class checks them
)


def lookup(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def check_rules(cfg: Any, rules: dict[str, Any]) -> None:
    """Raise ConfigError naming the first key whose value breaks its rule."""
    for key, rule in rules.items():
        rule.check(key, lookup(cfg, key))
