"""Async training in Ray mode: the driver's rollout thread dispatches the next steps to the
workers while the trainer updates, and the trainer pushes each update's weights to them (one
caller on the pool at a time). Every step reports its staleness within the bound, and after the
last update the workers hold the trainer's weights."""

from __future__ import annotations

import pytest

from tests.ray.conftest import MOVING, ray_overrides, train
from tests.ray.test_ray_training import check_run

pytestmark = pytest.mark.ray


def test_async_training_samples_on_the_workers_and_their_weights_follow(
    ray_cluster, make_train_config, tmp_path
):
    extra = {
        **MOVING,
        "async_training.enable": "true",
        "async_training.staleness_threshold": "1",
        "actor_rollout_ref.rollout.name": "hf",
    }
    cfg = make_train_config(steps=3, out=tmp_path / "async", **ray_overrides(2), **extra)
    run = train(cfg, inspect=True)
    check_run(run, steps=3)  # 2 workers, no restarts, the last push is in the workers
    stale = [r["async/staleness"] for r in run.records]
    assert all(0 <= s <= 1 for s in stale), stale
    assert run.records[0]["async/staleness"] == 0  # step 1: the starting weights
