"""Async training under FSDP2: rank 0's rollout thread samples ahead from its unsharded copy
while every rank runs the sharded update, and the shards are gathered into that copy between
updates. On 2 gloo ranks the first step (sampled from the starting weights) matches one
process, every step reports its staleness, and after the last update rank 0's rollout copy
holds the shards' weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import train_overrides
from tests.distributed import run_world, varied_score
from toolgrpo.config.loader import ConfigError, load_config
from toolgrpo.config.schema import TrainConfig

EQUAL = ["actor/loss", "actor/pg_loss", "actor/entropy", "actor/grad_norm", "reward/mean"]


def _cfg(model, data, out: Path, steps: int, world: int, **extra) -> TrainConfig:
    extra = {
        "async_training.enable": "true",
        "async_training.staleness_threshold": 1,
        "actor_rollout_ref.rollout.name": "hf",
        "actor_rollout_ref.actor.optim.lr": 1e-2,  # the weights move visibly in a step
        "data.max_response_length": 6,
        "trainer.device": "cpu",
        "trainer.seed": 3,
        "trainer.distributed.strategy": "fsdp2" if world > 1 else "none",
        **extra,
    }
    return load_config(TrainConfig, None, train_overrides(model, data, out, steps, **extra))


def _run(world: int, args: tuple, result: str) -> None:
    from toolgrpo.distributed.fsdp import full_tensors
    from toolgrpo.trainer.trainer import Trainer

    trainer = Trainer(_cfg(*args, world))
    try:
        start = {k: v.detach().clone() for k, v in trainer.policy.model.named_parameters()}
        history = trainer.fit()
        # the shards' weights, gathered (a collective under fsdp2), against rank 0's copy
        root = trainer.actor.root
        full = dict(full_tensors(root, True)) if root is not None else None
        if trainer.ranks.main:
            copy = {k: v.detach() for k, v in trainer.policy.model.named_parameters()}
            if full is not None:
                full = {k.removeprefix("lm."): v for k, v in full.items()}
            torch.save({"history": history, "start": start, "copy": copy, "full": full}, result)
    finally:
        trainer.close()


def _train(model, data, out: Path, steps: int, world: int) -> dict:
    result = str(out.parent / f"{out.name}_{world}.pt")
    return run_world(_run, world, (model, data, out, steps), result)


def test_async_training_runs_sharded_and_its_rollout_copy_follows_the_shards(
    tiny_model_dir, tiny_data, tmp_path, monkeypatch
):
    from toolgrpo.trainer import rollout_stage

    monkeypatch.setattr(rollout_stage, "score", varied_score)
    one = _train(tiny_model_dir, tiny_data, tmp_path / "one", 3, 1)
    two = _train(tiny_model_dir, tiny_data, tmp_path / "two", 3, 2)
    h1, h2 = one["history"], two["history"]
    assert [len(h1), len(h2)] == [3, 3]
    assert h1[0]["actor/grad_norm"] > 0  # something to match
    for k in EQUAL:  # step 1 is sampled from the starting weights in both
        assert h2[0][k] == pytest.approx(h1[0][k], rel=1e-4, abs=1e-5), k
    for h in (h1, h2):
        assert all(0 <= r["async/staleness"] <= 1 for r in h), [r["async/staleness"] for r in h]
    # rank 0's rollout copy holds what the shards hold after the last update, and it moved
    assert two["full"] is not None and two["full"].keys() <= two["copy"].keys()
    for k, w in two["full"].items():
        torch.testing.assert_close(two["copy"][k], w, atol=0, rtol=0, msg=k)
    assert any(not torch.equal(two["copy"][k], two["start"][k]) for k in two["full"])


def test_every_rank_sampling_is_refused_with_async(tiny_model_dir, tiny_data, tmp_path):
    from toolgrpo.distributed.fsdp import rollout_on_all

    cfg = _cfg(tiny_model_dir, tiny_data, tmp_path, 1, 2)
    assert rollout_on_all(cfg) is False  # auto: rank 0's thread samples
    cfg.trainer.distributed.rollout_ranks = "all"
    with pytest.raises(ConfigError, match="rollout_ranks=all with async_training.enable"):
        rollout_on_all(cfg)
