"""Rewards are checked as they will train: cast to float32. A reward finite in Python but past
float32's range (1e39 from a custom env, a remote env's ``"score": 1e308``) used to pass the
finiteness check, become inf in the scores tensor and end the run with a traceback
(``ValueError: non-finite score in group ...``), under ``reward.nan_policy=zero`` too."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from toolgrpo.config.loader import load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.rewards.scoring import Score, finite_in_float32, is_finite
from toolgrpo.rollout.episode import Episode
from toolgrpo.trainer.episodes import EpisodeRunner, NonFiniteReward

F32_MAX = torch.finfo(torch.float32).max


def test_finite_in_float32_matches_the_cast():
    for x in (0.0, -1.5, 1e38, F32_MAX, -F32_MAX, 3.4028235e38):
        assert finite_in_float32(x) and torch.isfinite(torch.tensor(x, dtype=torch.float32))
    for x in (1e39, -1e39, 1e308, float("nan"), float("inf"), 3.4028236e38 * 1.0001):
        assert not finite_in_float32(x)
        assert not torch.isfinite(torch.tensor(x, dtype=torch.float32))
    assert not is_finite(Score(1e39, 0.0, 0.0, 0.0, True, None))  # single-turn scores too


def _runner(policy: str) -> EpisodeRunner:
    cfg = load_config(
        TrainConfig,
        None,
        ["actor_rollout_ref.rollout.multi_turn.enable=true", f"reward.nan_policy={policy}"],
    )
    return EpisodeRunner(cfg, None, SimpleNamespace(pad_token_id=0), EnvRouter())


def _episodes(rewards: list[float]) -> list[Episode]:
    out = []
    for r in rewards:
        e = Episode("t#0", "calculator", "g", [1, 2], [5, 6], [1, 1], [-0.1, -0.2])
        e.reward = r
        out.append(e)
    return out


def test_an_overflowing_reward_is_zeroed_under_nan_policy_zero():
    batch, bad = _runner("zero").to_batch(_episodes([1e39, 1.0, 1e308]))
    assert bad == 2
    assert batch.scores_B.tolist() == [0.0, 1.0, 0.0]
    assert torch.isfinite(batch.scores_B).all()


def test_an_overflowing_reward_stops_the_run_in_one_line_under_error():
    with pytest.raises(NonFiniteReward, match=r"non-finite reward 1e\+39 \(in float32.*'t#0'"):
        _runner("error").to_batch(_episodes([1e39, 1.0]))
