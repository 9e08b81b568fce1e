"""A mixture under ``trainer.distributed.backend=ray`` (issue #17, item 7; refused at startup on
main): the workers sample the actor's groups, the fixed policy samples its groups in the driver,
and the fixed rows get the decoupled IS correction."""

from __future__ import annotations

import math

import pytest

from tests.conftest import read_metrics
from tests.ray.conftest import all_finite, ray_overrides
from toolgrpo.trainer.trainer import Trainer

pytestmark = pytest.mark.ray


@pytest.mark.parametrize("multi_turn", [False, True], ids=["single_turn", "multi_turn"])
def test_mixture_trains_with_ray_rollout_workers(
    ray_cluster, make_train_config, tmp_path, monkeypatch, multi_turn
):
    from toolgrpo.models.tiny import build_tiny_model_dir

    fixed_dir = build_tiny_model_dir(tmp_path / "fixed", seed=1)
    out = tmp_path / "mix"
    extra = {
        "rollout_only.model_path": str(fixed_dir),
        "rollout_only.temperature": "0.8",
        "rollout_allocation_schedule.alpha": "0.5",
        "rollout_allocation_schedule.per_sample": "true",
        "data.train_batch_size": "4",
        "trainer.save_hf_model": "false",
    }
    if multi_turn:
        extra.update(
            {
                "data.train_files": "[calculator:train]",
                "data.max_response_length": "24",
                "actor_rollout_ref.rollout.multi_turn.enable": "true",
                "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn": "8",
            }
        )
    trainer = Trainer(make_train_config(steps=2, out=out, **ray_overrides(2), **extra))
    assert trainer.pool is not None and trainer.mixture is not None
    played_by: list[str] = []
    orig = trainer.pool.generate if not multi_turn else trainer.pool.play

    def spy(*args, **kwargs):
        played_by.append("workers")
        return orig(*args, **kwargs)

    monkeypatch.setattr(trainer.pool, "play" if multi_turn else "generate", spy)
    try:
        trainer.fit()
    finally:
        trainer.close()
    recs = read_metrics(out)
    assert [r["step"] for r in recs] == [1, 2]
    shares = [r["rollout/using_fixed"] for r in recs]
    assert 0 < sum(shares) < len(shares), shares  # both policies sampled
    for r in recs:
        all_finite(r)
        if r["rollout/using_fixed"] > 0:
            assert math.isfinite(r["actor/importance_weight_mean"])
            assert 0 < r["rollout/fixed_seq_ess"] <= 1
    assert played_by  # the actor's groups went to the workers
