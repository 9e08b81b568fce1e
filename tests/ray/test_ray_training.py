"""Training in Ray mode on a local cluster: 2 rollout workers, the tiny model, a few steps.

The workers' weights follow the trainer's (for full fine-tuning and LoRA), multi-turn episodes
are played on the workers, and one worker reproduces the local backend exactly.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import read_metrics
from tests.ray.conftest import MOVING, Run, all_finite, ray_overrides, train
from toolgrpo.trainer.trainer import Trainer

pytestmark = pytest.mark.ray


def check_run(run: Run, steps: int) -> None:
    """Every step ran on 2 workers without restarts, and the weights pushed after the last
    update are in the workers: their greedy log-probs are the trainer's, not the start's."""
    assert [r["step"] for r in run.records] == list(range(1, steps + 1))
    for step, r in enumerate(run.records, start=1):
        all_finite(r)
        assert r["ray/num_workers"] == 2.0
        assert r["ray/weight_version"] == float(step)  # pushed after this step's update
        assert r["ray/worker_restarts"] == 0.0
        assert r["ray/worker_compute_s"] > 0 and r["ray/weight_push_s"] > 0
    assert run.versions == {steps}
    moved = 0.0
    g = run.greedy
    for r, lo, st in zip(g["remote"], g["trainer"], g["start"], strict=True):
        assert r.prompt_index == lo.prompt_index and r.token_ids == lo.token_ids
        torch.testing.assert_close(r.logprobs, lo.logprobs, rtol=0, atol=1e-4)
        if st.token_ids != lo.token_ids:
            moved = 1.0
        else:
            moved = max(
                [moved] + [abs(a - b) for a, b in zip(st.logprobs, lo.logprobs, strict=True)]
            )
    assert moved > 1e-3, "the trainer's weights did not move: the check above proves nothing"


def test_two_workers_train_full_fine_tuning(clean_run):
    check_run(clean_run, steps=3)


def test_two_workers_train_lora(ray_cluster, make_train_config, tmp_path):
    extra = {**MOVING, "actor_rollout_ref.model.lora_rank": "4"}
    cfg = make_train_config(steps=2, out=tmp_path / "lora", **ray_overrides(2), **extra)
    run = train(cfg, inspect=True)
    check_run(run, steps=2)
    assert ray_cluster.is_initialized()  # the pool joined the tier's cluster: not its to stop


def test_multi_turn_calculator_episodes_are_played_on_the_workers(
    ray_cluster, make_train_config, tmp_path, monkeypatch
):
    def no_local_play(*args, **kwargs):
        raise AssertionError("episodes were played in the trainer's process")

    # The base class's play is what a worker runs; in the driver it must not run.
    monkeypatch.setattr("toolgrpo.trainer.episodes.EpisodeRunner.play", no_local_play)
    out = tmp_path / "mt"
    extra = {
        "data.train_files": "[calculator:train]",
        "data.val_files": "[calculator:test]",
        "data.val_max_samples": "2",
        "data.max_response_length": "24",
        "actor_rollout_ref.rollout.multi_turn.enable": "true",
        "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn": "8",
        "trainer.test_freq": "2",
    }
    trainer = Trainer(make_train_config(steps=2, out=out, **ray_overrides(2), **extra))
    try:
        trainer.fit()
    finally:
        trainer.close()
    recs = read_metrics(out)
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        all_finite(r)
        assert r["batch/size"] == 4
        assert r["ray/worker_compute_s"] > 0
        assert "episode/calculator/turns/mean" in r and "episode/reward/mean" in r
    assert "val/episode/reward/mean" in recs[1]  # validation episodes ran on the workers too


def test_one_worker_reproduces_the_local_backend(ray_cluster, make_train_config, tmp_path):
    """Same seed, same model, one thread on both sides: the worker draws the samples the local
    backend would (``CallSeeds``), so the whole run is identical. With 2+ workers each chunk has
    its own seed, so samples differ from local ones; ``test_ray_faults`` checks that those runs
    are reproducible instead."""
    one_thread = {"trainer.num_threads": "1"}
    local = train(make_train_config(steps=2, out=tmp_path / "local", **MOVING, **one_thread))
    ray = train(make_train_config(steps=2, out=tmp_path / "ray", **MOVING, **ray_overrides(1)))
    for a, b in zip(local.records, ray.records, strict=True):
        for key in ("reward/mean", "tokens/generated", "response_length/mean", "actor/pg_loss"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), key
    for k, v in local.weights.items():
        torch.testing.assert_close(ray.weights[k], v, rtol=0, atol=1e-6, msg=k)
