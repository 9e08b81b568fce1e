"""``reward.tool_call_cost``: a fixed price per tool call in the LM's reward with no router head
(OTC's setting), through the same price object the router hands the LM."""

from __future__ import annotations

from itertools import cycle

import pytest
import torch

from tests.conftest import read_metrics
from toolgrpo.config.loader import ConfigError
from toolgrpo.config.validate import validate_train_config
from toolgrpo.rewards.scoring import Score
from toolgrpo.router.lm_price import call_price
from toolgrpo.router.usage import ToolUsage
from toolgrpo.trainer import rollout_stage as stage_mod
from toolgrpo.trainer.trainer import Trainer


def test_the_price_comes_off_the_lms_score_per_call_and_spares_negatives():
    price = call_price([2, 0, None], 0.25, norm_by_std=True)
    got = price.scores(torch.tensor([1.0, 1.0, -1.0]))
    assert got.tolist() == pytest.approx([0.5, 1.0, -1.0])  # a negative keeps its fixed score
    assert price.advantages(object()) == {}  # in the reward only: no advantage-level term


@pytest.mark.parametrize("cost, want", [("0.0", (0.0, 0.0)), ("0.3", (-(0.5**0.5), 0.5**0.5))])
def test_a_call_ranks_below_the_same_reward_without_one(
    make_train_config, tmp_path, monkeypatch, cost, want
):
    """Every rollout scores 1; in each group one calls a tool and one does not. Free calls
    leave every advantage 0; at a price the caller's GRPO advantage is −1/√2, the other's
    +1/√2. Logged rewards stay the task's."""
    monkeypatch.setattr(stage_mod, "score", lambda *a: Score(1.0, 0.0, 1.0, 0.0, True, None))
    used = cycle([ToolUsage({"SEARCH": 1}), ToolUsage()])
    monkeypatch.setattr(stage_mod, "usage_of_rollout", lambda *a: next(used))
    out = tmp_path / "run"
    trainer = Trainer(make_train_config(steps=1, out=out, **{"reward.tool_call_cost": cost}))
    seen = []
    orig = trainer.compute_advantages

    def spy(batch, price):
        m = orig(batch, price)
        seen.append(batch.advantages_BR[:, 0].tolist())
        return m

    trainer.compute_advantages = spy
    trainer.fit()
    for tool, plain in zip(seen[0][0::2], seen[0][1::2], strict=True):
        assert (tool, plain) == pytest.approx(want, abs=1e-4)
    rec = read_metrics(out)[0]
    assert rec["reward/mean"] == pytest.approx(1.0)
    assert rec.get("reward/call_penalty_mean", 0.0) == pytest.approx(float(cost) / 2)


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"router.enable": "true"}, "router's λ prices them"),
        ({"algorithm.filter_groups.enable": "true"}, "filter_groups"),
        ({"reward.tool_call_cost": "-1"}, "reward.tool_call_cost"),
    ],
)
def test_what_a_call_cost_cannot_run_with_is_refused_in_one_line(make_train_config, extra, match):
    cfg = make_train_config(**{"reward.tool_call_cost": "0.2", **extra})
    with pytest.raises(ConfigError, match=match) as err:
        validate_train_config(cfg)
    assert "\n" not in str(err.value)
