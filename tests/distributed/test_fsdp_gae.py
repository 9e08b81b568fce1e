"""GAE's critic under FSDP2: 2 steps on 2 gloo ranks match one process at step 1, and a
checkpoint resumes across the world-size change both ways with the value head it saved. Before,
``check_strategy`` refused ``algorithm.adv_estimator=gae`` with fsdp2: the head is sharded in the
actor's root unit, and checkpoints saved and loaded it as one process's whole tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import read_metrics, train_overrides
from tests.distributed import run_world, varied_score
from toolgrpo.config.loader import load_config
from toolgrpo.config.schema import TrainConfig

# Step 1 sees the same batch (greedy, whichever rank samples a group) and the same weights.
EQUAL = [
    "actor/loss",
    "actor/pg_loss",
    "actor/entropy",
    "actor/grad_norm",
    "critic/vf_loss",
    "critic/vf_clipfrac",
    "reward/mean",
]


def _cfg(model, data, out: Path, steps: int, world: int) -> TrainConfig:
    extra = {
        "algorithm.adv_estimator": "gae",
        "critic.lr": 1e-2,  # the head moves visibly in a step
        "data.max_response_length": 6,
        "trainer.save_freq": 1,
        "trainer.device": "cpu",
        "trainer.distributed.strategy": "fsdp2" if world > 1 else "none",
        # Every rank samples its share (the default), each from a stream of its own: greedy
        # decoding (top-k 1) gives the one-process batch.
        "actor_rollout_ref.rollout.top_k": 1,
    }
    return load_config(TrainConfig, None, train_overrides(model, data, out, steps, **extra))


def _run(world: int, args: tuple, result: str) -> None:
    """One rank (or the one process) of ``toolgrpo train``; rank 0 saves the step metrics and
    the value head as the run started with it (after any resume), gathered whole."""
    from toolgrpo.distributed.fsdp import full_module_state
    from toolgrpo.trainer.trainer import Trainer

    trainer = Trainer(_cfg(*args, world))
    try:
        start = full_module_state(trainer.actor.value_head)  # a collective under fsdp2
        history = trainer.fit()
        if trainer.ranks.main:
            torch.save({"history": history, "start": start}, result)
    finally:
        trainer.close()


def _train(model, data, out: Path, steps: int, world: int) -> dict:
    """Ranks are spawned; the one process is this one (it saves a process start)."""
    result = str(out.parent / f"{out.name}_{steps}_{world}.pt")
    return run_world(_run, world, (model, data, out, steps), result)


def _saved_head(out: Path, step: int) -> dict[str, torch.Tensor]:
    opt = torch.load(out / "checkpoints" / f"global_step_{step}" / "optimizer.pt")
    return opt["value_head"]


def test_gae_trains_on_two_ranks_and_resumes_across_world_sizes(
    tiny_model_dir, tiny_data, tmp_path, monkeypatch
):
    from toolgrpo.trainer import rollout_stage

    monkeypatch.setattr(rollout_stage, "score", varied_score)
    one, two = tmp_path / "one", tmp_path / "two"
    h1 = _train(tiny_model_dir, tiny_data, one, 2, 1)["history"]
    h2 = _train(tiny_model_dir, tiny_data, two, 2, 2)["history"]
    assert [len(h1), len(h2)] == [2, 2]
    assert h1[0]["critic/vf_loss"] > 0  # something to match
    for k in EQUAL:
        assert h2[0][k] == pytest.approx(h1[0][k], rel=1e-4, abs=1e-5), k
    # The 2-rank checkpoint holds the whole head (not rank 0's shard), as one process's does.
    for k, w in _saved_head(one, 1).items():
        got = _saved_head(two, 1)[k]
        assert type(got) is torch.Tensor and got.shape == w.shape, k
        torch.testing.assert_close(got, w, atol=1e-5, rtol=1e-4, msg=k)
    saved_two, saved_one = _saved_head(two, 2), _saved_head(one, 2)
    assert any(t.abs().sum() > 0 for t in saved_two.values())  # the head learned something

    # 2 ranks' checkpoint in one process, and one process's on 2 ranks: a third step each,
    # starting from the head it saved.
    for out, world, saved in ((two, 1, saved_two), (one, 2, saved_one)):
        got = _train(tiny_model_dir, tiny_data, out, 3, world)
        assert len(got["history"]) == 1
        assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]
        assert got["start"].keys() == saved.keys()
        for k, w in saved.items():
            torch.testing.assert_close(got["start"][k], w, atol=0, rtol=0, msg=k)
        assert got["history"][0]["critic/vf_loss"] > 0
