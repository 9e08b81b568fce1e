"""Tool rollback settings: defaults, overrides from the command line, and bad values refused with
the offending key named."""

from __future__ import annotations

import pytest

from toolgrpo.config.loader import ConfigError, load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.config.validate import validate_train_config
from toolgrpo.rollout.rollback import RollbackPolicy

KEY = "actor_rollout_ref.rollout.multi_turn."


def cfg(**over: str) -> TrainConfig:
    overrides = [f"{KEY}enable=true"] + [f"{KEY}{k}={v}" for k, v in over.items()]
    return load_config(TrainConfig, None, overrides)


def test_defaults_and_overrides():
    mt = TrainConfig().actor_rollout_ref.rollout.multi_turn
    assert not mt.enable_tool_rollback and mt.negative_reward == -1.0
    assert RollbackPolicy.from_config(mt) is None  # off: the loop takes no snapshots
    zero = cfg(enable_tool_rollback="true", max_tool_retries="0")
    assert RollbackPolicy.from_config(zero.actor_rollout_ref.rollout.multi_turn) is None
    c = cfg(
        enable_tool_rollback="true",
        max_tool_retries="3",
        max_negative_samples_per_group="1",
        rollback_error_patterns="['ImportError', 'Traceback']",
        rollback_error_types="[parse]",
    )
    validate_train_config(c)
    p = RollbackPolicy.from_config(c.actor_rollout_ref.rollout.multi_turn)
    assert p is not None and p.max_retries == 3 and p.max_negatives_per_group == 1
    assert [x.pattern for x in p.patterns] == ["ImportError", "Traceback"]
    assert p.error_types == frozenset({"parse"}) and p.save_negatives


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"max_negative_samples_per_group": "-1"}, "max_negative_samples_per_group must be >= 0"),
        ({"max_tool_retries": "-2"}, "max_tool_retries must be >= 0"),
        ({"rollback_error_patterns": "['ok', '(unclosed']"}, r"rollback_error_patterns\[1\]"),
        ({"rollback_error_types": "[typo]"}, "rollback_error_types='typo' is not one of"),
    ],
)
def test_bad_values_name_the_key(over, message):
    with pytest.raises(ConfigError, match=message):
        validate_train_config(cfg(enable_tool_rollback="true", **over))


def test_rollback_needs_multi_turn():
    c = load_config(TrainConfig, None, [f"{KEY}enable_tool_rollback=true"])
    with pytest.raises(ConfigError, match="enable_tool_rollback needs .*multi_turn.enable=true"):
        validate_train_config(c)
