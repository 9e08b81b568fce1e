"""``multi_turn.mask_truncated`` (DAPO's overlong filtering): truncated episodes keep their
scores in their groups' baselines but train no token; ``rollout/truncated_frac`` logs their
share. New: before, a truncated episode always trained."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

from tests.conftest import read_metrics
from tests.rollout.test_multi_turn import CALL, AddEnv, ScriptedGenerator
from toolgrpo.data.task import Task
from toolgrpo.envs.base import EnvReward
from toolgrpo.envs.registry import register_env
from toolgrpo.rollout.episode import Episode
from toolgrpo.trainer.batch import collate_episodes
from toolgrpo.trainer.episodes import mask_truncated_rows
from toolgrpo.trainer.trainer import Trainer

KEY = "actor_rollout_ref.rollout.multi_turn."
ANSWER = "<answer>5</answer>"


class Alternating(AddEnv):
    """Every other episode gets one turn (its call runs, then ``max_turns``: truncated, scored
    0.25); the others answer on their second turn (1.0). Episodes are built group by group, so
    each group of two holds one of each."""

    made = 0

    def __init__(self) -> None:
        type(self).made += 1
        self.cut = type(self).made % 2 == 1
        super().__init__()

    @property  # type: ignore[override]
    def max_turns(self) -> int:
        return 1 if self.cut else 3

    @max_turns.setter
    def max_turns(self, value: int) -> None:  # the router's value is ignored
        pass

    async def reward(self, transcript):
        got = await super().reward(transcript)
        return EnvReward(got.score or 0.25)


@register_env("test_alternating")
def _alternating(task: Task, options: Mapping[str, Any]) -> AddEnv:
    return Alternating()


@pytest.mark.parametrize("masked", [True, False])
def test_truncated_episodes_stay_in_the_baseline_and_train_nothing(
    make_train_config, tmp_path, tiny_model_dir, masked
):
    Alternating.made = 0
    cfg = {
        f"{KEY}enable": "true",
        f"{KEY}envs": "{add: {type: test_alternating, max_turns: 3}}",
        f"{KEY}mask_truncated": str(masked).lower(),
        "data.max_response_length": "300",
    }
    trainer = Trainer(make_train_config(steps=1, out=tmp_path / "run", **cfg))
    tasks = [Task(i, ({"role": "user", "content": "2+3?"},), "5", "test", "add") for i in "ab"]
    trainer.tasks, trainer.sampler.num_tasks = tasks, len(tasks)
    trainer.generator = ScriptedGenerator(
        AutoTokenizer.from_pretrained(tiny_model_dir), [CALL, ANSWER]
    )
    seen = []
    update = trainer.actor.update

    def watch(batch):
        seen.append((batch, batch.response_mask_BR.sum(1).tolist(), batch.advantages_BR.clone()))
        return update(batch)

    trainer.actor.update = watch
    trainer.fit()
    (batch, trained, adv), rec = seen[0], read_metrics(tmp_path / "run")[0]
    assert batch.truncated == [True, False, True, False]
    assert batch.scores_B.tolist() == [0.25, 1.0, 0.25, 1.0]
    assert rec["rollout/truncated_frac"] == 0.5
    assert rec["rollout/truncated_masked"] == (2.0 if masked else 0.0)
    sampled = batch.response_mask_BR.sum(1)  # put back after the update
    assert all(n > 0 for n in sampled.tolist())
    assert rec["tokens/generated"] == float(sampled.sum())
    for row in range(4):
        # Advantages came first, from every score: each group is (0.25, 1.0), never a singleton.
        a = adv[row][batch.response_mask_BR[row].bool()]
        want = -0.7071 if batch.truncated[row] else 0.7071
        assert torch.allclose(a, torch.full_like(a, want), atol=1e-3)
        if masked and batch.truncated[row]:
            assert trained[row] == 0.0  # ... then the update saw no token of the truncated rows
        else:
            assert trained[row] == sampled[row]


def test_mask_truncated_rows_is_a_no_op_without_truncation():
    ep = Episode("t", "add", "u", [1, 2], [3, 4], [1, 1], [-0.1, -0.2])
    batch = collate_episodes([ep], pad_id=0)
    assert mask_truncated_rows(batch) is None  # no ``truncated`` flags (e.g. single-turn)
    batch.truncated = [False]
    assert mask_truncated_rows(batch) is None and batch.response_mask_BR.sum() == 2
    batch.truncated = [True]
    full = mask_truncated_rows(batch)
    assert full is not None and full.sum() == 2 and batch.response_mask_BR.sum() == 0
