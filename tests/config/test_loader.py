"""Config loading: defaults, YAML + dotted overrides, friendly errors, and semantic validation."""

from __future__ import annotations

import dataclasses

import pytest

from toolgrpo.config.loader import ConfigError, load_config, valid_keys
from toolgrpo.config.schema import TrainConfig
from toolgrpo.config.validate import validate_train_config


def test_defaults_load_and_validate():
    cfg = load_config(TrainConfig)
    assert isinstance(cfg, TrainConfig)
    assert cfg == TrainConfig()
    assert cfg.data.train_files == ["rlla:train"]
    assert cfg.algorithm.adv_estimator == "grpo"
    validate_train_config(cfg)


def test_valid_keys_cover_nested_leaves():
    keys = valid_keys(TrainConfig)
    assert "data.train_batch_size" in keys
    assert "actor_rollout_ref.actor.optim.lr" in keys
    assert "actor_rollout_ref" in keys  # a whole sub-tree is addressable too


def test_yaml_then_overrides_merge(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(
        "data:\n  train_batch_size: 8\n  max_response_length: 64\n"
        "actor_rollout_ref:\n  actor:\n    optim:\n      lr: 3.0e-5\n"
    )
    cfg = load_config(
        TrainConfig,
        f,
        ["data.train_batch_size=16", "trainer.logger=[jsonl]", "+trainer.seed=7"],
    )
    assert cfg.data.train_batch_size == 16  # override beats YAML
    assert cfg.data.max_response_length == 64  # YAML beats default
    assert cfg.actor_rollout_ref.actor.optim.lr == pytest.approx(3e-5)
    assert cfg.trainer.logger == ["jsonl"]
    assert cfg.trainer.seed == 7
    assert cfg.data.max_prompt_length == TrainConfig().data.max_prompt_length  # untouched default
    assert isinstance(cfg.data, type(TrainConfig().data))  # real dataclasses, not DictConfig
    assert dataclasses.is_dataclass(cfg.actor_rollout_ref.actor.optim)


def test_typo_override_suggests_the_key():
    with pytest.raises(ConfigError) as ei:
        load_config(TrainConfig, None, ["data.train_batch_sise=4"])
    msg = str(ei.value)
    assert "unknown key" in msg
    assert "data.train_batch_sise" in msg
    assert "did you mean 'data.train_batch_size'" in msg


def test_typo_in_yaml_file_names_file_and_key(tmp_path):
    f = tmp_path / "typo.yaml"
    f.write_text("data:\n  train_batch_sise: 4\n")
    with pytest.raises(ConfigError) as ei:
        load_config(TrainConfig, f)
    msg = str(ei.value)
    assert "unknown key" in msg
    assert "did you mean 'data.train_batch_size'" in msg
    assert str(f) in msg


def test_unknown_top_level_section_in_yaml(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("nonsense_section:\n  x: 1\n")
    with pytest.raises(ConfigError, match="unknown key 'nonsense_section.x'"):
        load_config(TrainConfig, f)


def test_bad_value_type_names_the_key():
    with pytest.raises(ConfigError) as ei:
        load_config(TrainConfig, None, ["data.train_batch_size=abc"])
    assert "data.train_batch_size" in str(ei.value)


def test_override_without_equals_sign():
    with pytest.raises(ConfigError, match="key=value"):
        load_config(TrainConfig, None, ["data.train_batch_size"])


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(TrainConfig, tmp_path / "nope.yaml")


def test_unparsable_yaml(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("data: [unclosed\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        load_config(TrainConfig, f)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["algorithm.adv_estimator=ppo2"], "algorithm.adv_estimator"),
        (["actor_rollout_ref.rollout.n=1"], "actor_rollout_ref.rollout.n >= 2"),
        (
            ["data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=4"],
            "multiple of",
        ),
        (["actor_rollout_ref.actor.clip_ratio_c=1.0"], "clip_ratio_c"),
        (["actor_rollout_ref.actor.clip_ratio_c=0.5"], "clip_ratio_c"),
        (
            ["actor_rollout_ref.actor.use_kl_loss=true", "algorithm.use_kl_in_reward=true"],
            "not both",
        ),
        (["actor_rollout_ref.rollout.top_p=0"], "top_p"),
        (["data.train_batch_size=0"], "data.train_batch_size"),
        (["actor_rollout_ref.actor.loss_agg_mode=mean"], "loss_agg_mode"),
        (["reward.nan_policy=ignore"], "reward.nan_policy"),
        (["data.bad_rows=warn"], "data.bad_rows"),
    ],
)
def test_validate_rejects(overrides, needle):
    cfg = load_config(TrainConfig, None, overrides)  # types are fine; meaning is not
    with pytest.raises(ConfigError) as ei:
        validate_train_config(cfg)
    assert needle in str(ei.value)


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_group_estimators_need_n_at_least_2(estimator):
    cfg = load_config(
        TrainConfig, None, [f"algorithm.adv_estimator={estimator}", "actor_rollout_ref.rollout.n=1"]
    )
    with pytest.raises(ConfigError, match="n >= 2"):
        validate_train_config(cfg)


def test_validate_accepts_gae_with_n1_and_kl_plus_suffix():
    cfg = load_config(
        TrainConfig,
        None,
        [
            "algorithm.adv_estimator=gae",
            "actor_rollout_ref.rollout.n=1",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.kl_loss_type=low_var_kl+",
        ],
    )
    validate_train_config(cfg)


@pytest.mark.parametrize("text", ["", "# nothing to override yet\n"])
def test_empty_yaml_file_means_defaults(tmp_path, text):
    f = tmp_path / "empty.yaml"
    f.write_text(text)
    assert load_config(TrainConfig, f) == TrainConfig()
