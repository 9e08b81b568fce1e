"""Bad router settings are refused before anything loads, naming the key."""

from __future__ import annotations

import pytest

from toolgrpo.config.loader import ConfigError, load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.config.validate import validate_train_config


def _check(*overrides: str) -> None:
    validate_train_config(load_config(TrainConfig, None, list(overrides)))


def test_defaults_are_valid_and_off():
    cfg = load_config(TrainConfig, None, [])
    assert cfg.router.enable is False and cfg.router.routes == ["ANSWER", "SEARCH", "CALCULATE"]
    validate_train_config(cfg)
    _check("router.enable=true", "router.budget=0.6", "router.lr=null")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["router.routes=[ANSWER,BROWSE]"], r"router.routes\[1\]: unknown route 'BROWSE'"),
        (["router.routes=[ANSWER,ANSWER]"], "at least 2 distinct routes"),
        (["router.pooling=max"], "router.pooling='max'"),
        (["router.lm_reward=both"], "router.lm_reward='both'"),  # issue 18
        (["router.lagrangian=adv"], "router.lagrangian='adv'"),
        (["router.infer_mode=greedy"], "router.infer_mode='greedy' is not one of auto, threshold"),
        (
            ["router.enable=true", "router.lagrangian=advantage", "algorithm.adv_estimator=gae"],
            "router.lagrangian=advantage centres cost within GRPO groups",
        ),
        (["router.cost.mode=tokens"], "router.cost.mode='tokens'"),
        (["router.budget=1.5"], r"router.budget=1.5 must lie in \[0, 1\]"),
        (["router.budget=-0.1"], r"must lie in \[0, 1\]"),
        (["router.cost.mode=family", "router.budget=3.5"], r"\[0, 3\]"),
        (["router.cost.mode=calls", "router.cost.max_calls=2", "router.budget=2.5"], r"\[0, 2\]"),
        (["router.dual_lr=-1"], "router.dual_lr must be"),
        (["router.dual_kp=-1"], "router.dual_kp must be"),
        (["router.lambda_init=-0.5"], "router.lambda_init must be"),
        (["router.update_every=0"], "router.update_every must be > 0"),
        (["router.lr=0"], "router.lr must be > 0"),
        (["router.label_coeff=0.1"], "router.label_coeff > 0 needs router.label_file"),
        (["router.label_file=/nonexistent/labels.json"], "router.label_file='/nonexistent"),
        (["router.families_file=/nonexistent.json"], "router.families_file='/nonexistent.json'"),
        (["router.labeler.base_url=http://x"], "router.labeler.model"),
        (["router.enable=true", "async_training.enable=true"], "async_training"),
        (["router.enable=true", "actor_rollout_ref.rollout.n=1"], "rollout.n >= 2"),
    ],
)
def test_bad_router_settings(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _check(*overrides)


def test_family_mode_budget_range_follows_the_weights():
    _check("router.cost.mode=family", "router.cost.c_other=0", "router.budget=2.0")
    with pytest.raises(ConfigError, match=r"\[0, 2\]"):
        _check("router.cost.mode=family", "router.cost.c_other=0", "router.budget=2.1")
