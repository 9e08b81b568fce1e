"""``trainer.seed`` makes a run repeat on the same machine and software: same episodes, same
metrics, same weights; another seed draws other episodes and another task order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import read_metrics
from toolgrpo.trainer.trainer import Trainer

# Wall-clock and memory readings are the only metrics allowed to differ between repeats.
VOLATILE = ("timing/", "perf/", "memory/", "throughput/")


def _volatile(key: str) -> bool:
    return key.startswith(VOLATILE) or key.endswith("_per_s")


def _run(make_train_config, out: Path, seed: int, **extra) -> tuple[list[dict], dict, list]:
    cfg = make_train_config(
        steps=3,
        out=out,
        **{
            "trainer.seed": seed,
            "trainer.rollout_data_dir": str(out / "rollouts"),
            "actor_rollout_ref.actor.ppo_mini_batch_size": 1,  # two optimizer steps a step
            "data.max_response_length": 16,
            "actor_rollout_ref.actor.entropy_coeff": 0.01,  # a gradient even when rewards tie
            **extra,
        },
    )
    trainer = Trainer(cfg)
    trainer.fit()
    metrics = [{k: v for k, v in r.items() if not _volatile(k)} for r in read_metrics(out)]
    episodes, groups = [], {}
    for f in sorted((out / "rollouts").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            rec.pop("timing", None)
            # group uids are random labels: compare which episodes share one, not the label
            rec["uid"] = groups.setdefault(rec["uid"], len(groups))
            episodes.append(rec)
    return metrics, trainer.policy.model.state_dict(), episodes


FILTER = {
    "algorithm.filter_groups.enable": "true",
    "algorithm.filter_groups.max_num_gen_batches": 3,
}


@pytest.mark.parametrize("setting", ["single_turn", "multi_turn", "filter_groups"])
def test_same_seed_repeats_and_another_seed_does_not(make_train_config, tmp_path, setting):
    extra = (
        {"actor_rollout_ref.rollout.multi_turn.enable": "true"} if setting == "multi_turn" else {}
    )
    if setting == "filter_groups":  # dynamic sampling: each further batch seeded too
        extra = FILTER
    m1, w1, e1 = _run(make_train_config, tmp_path / "a", 7, **extra)
    m2, w2, e2 = _run(make_train_config, tmp_path / "b", 7, **extra)
    m3, _, e3 = _run(make_train_config, tmp_path / "c", 8, **extra)
    assert e1 and e1 == e2  # the same episodes, token for token
    assert m1 == m2  # every metric but wall-clock ones
    for k, v in w1.items():
        torch.testing.assert_close(w2[k], v, rtol=0, atol=0, msg=k)
    assert all(r["actor/grad_norm"] > 0 for r in m1)  # the weights did move
    assert [e["spans"] for e in e3] != [e["spans"] for e in e1]  # another seed, other samples


def test_the_task_order_follows_trainer_seed_unless_data_seed_is_set(make_train_config):
    from toolgrpo.config.schema import data_seed

    assert data_seed(make_train_config(**{"trainer.seed": 5})) == 5
    assert data_seed(make_train_config(**{"trainer.seed": 5, "data.seed": 2})) == 2
