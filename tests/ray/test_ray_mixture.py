"""A mixture under ``trainer.distributed.backend=ray`` (issue #17, item 7): every worker holds the
fixed policy too and samples its groups as it samples the actor's, the driver holds no fixed
model (unless a top-k/top-p sampler's support gap needs one), and the fixed rows get the
decoupled IS correction."""

from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import read_metrics, train_overrides
from tests.ray.conftest import all_finite, ray_overrides
from toolgrpo.config.loader import ConfigError, load_config
from toolgrpo.config.schema import ModelConfig, TrainConfig
from toolgrpo.distributed.pool import RolloutPool
from toolgrpo.models.loading import load_policy
from toolgrpo.rollout.generator import SamplingParams
from toolgrpo.rollout.hf import HFGenerator
from toolgrpo.trainer.trainer import Trainer

pytestmark = pytest.mark.ray

PROMPTS = [[1, 5, 9, 30 + i] for i in range(5)]
GREEDY = SamplingParams(n=1, max_new_tokens=5, do_sample=False)


@pytest.fixture(scope="module")
def fixed_dir(tmp_path_factory):
    from toolgrpo.models.tiny import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("ray_fixed") / "model", seed=1)


@pytest.fixture(scope="module")
def pool(ray_cluster, tiny_model_dir, tiny_data, fixed_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("mix_pool")
    over = train_overrides(
        tiny_model_dir,
        tiny_data,
        out,
        1,
        **ray_overrides(2, **{"rollout_only.model_path": str(fixed_dir)}),
    )
    p = RolloutPool(load_config(TrainConfig, None, over))
    yield p
    p.close()


def _tokens(completions) -> list[list[int]]:
    return [list(c.token_ids) for c in completions]


def test_the_workers_sample_the_fixed_policy_with_its_own_weights(pool, fixed_dir):
    """Greedy completions of the pool's fixed generator are the fixed model's (not the actor's),
    and stay so after the actor's weights are pushed: fixed policies never receive weights."""
    assert {i.fixed_loaded for i in pool.worker_info()} == {1}
    fixed = pool.fixed_generators["fixed"]
    remote = fixed.generate(PROMPTS, GREEDY)
    f = load_policy(ModelConfig(path=str(fixed_dir), dtype="float32"), trainable=False)
    local = HFGenerator(f.model, f.tokenizer, f.dtype).generate(PROMPTS, GREEDY)
    assert _tokens(remote) == _tokens(local)
    assert _tokens(pool.generator.generate(PROMPTS, GREEDY)) != _tokens(remote)  # the actor

    moved = load_policy(pool.cfg.actor_rollout_ref.model)
    with torch.no_grad():
        for p in moved.model.parameters():
            p.mul_(1.5)
    pool.sync_weights(moved.model, 3)
    assert _tokens(fixed.generate(PROMPTS, GREEDY)) == _tokens(local)


def test_a_replaced_worker_loads_the_fixed_policy_again(pool):
    """A worker killed mid-call is replaced; the replacement loads the fixed policy in its
    constructor and re-runs the chunk with the chunk's seed, so the samples are unchanged."""
    pool.restarts = pool.requeued = 0
    pool.dist.max_worker_restarts = 2
    params = SamplingParams(n=2, max_new_tokens=5)
    fixed = pool.fixed_generators["fixed"]
    torch.manual_seed(1234)  # what the trainer does before each step's rollout
    before = _tokens(fixed.generate(PROMPTS, params))
    pool.actors[1].inject_fault.remote("exit")
    torch.manual_seed(1234)
    after = _tokens(fixed.generate(PROMPTS, params))
    assert pool.restarts == 1 and pool.requeued == 1
    assert after == before
    assert {i.fixed_loaded for i in pool.worker_info()} == {1}


def test_a_bad_fixed_policy_is_refused_before_any_worker_starts(
    ray_cluster, make_train_config, tmp_path, monkeypatch
):
    def no_spawn(*args, **kwargs):
        raise AssertionError("a worker started before the fixed policy was checked")

    monkeypatch.setattr(RolloutPool, "_spawn", no_spawn)
    missing = tmp_path / "no_such_model"
    cfg = make_train_config(**ray_overrides(2, **{"rollout_only.model_path": str(missing)}))
    with pytest.raises(ConfigError, match=r"rollout_only\.model_path"):
        Trainer(cfg)


@pytest.mark.parametrize("multi_turn", [False, True], ids=["single_turn", "multi_turn"])
def test_mixture_trains_with_ray_rollout_workers(
    ray_cluster, make_train_config, fixed_dir, tmp_path, monkeypatch, multi_turn
):
    def no_local_rollout(*args, **kwargs):
        raise AssertionError("a rollout ran in the trainer's process")

    # What a worker runs; in the driver neither may run (workers are other processes).
    monkeypatch.setattr(HFGenerator, "generate", no_local_rollout)
    monkeypatch.setattr("toolgrpo.trainer.episodes.EpisodeRunner.play", no_local_rollout)
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
    else:  # a truncated sampler: its support gap loads the fixed model in the driver, lazily
        extra["rollout_only.top_k"] = "20"
    trainer = Trainer(make_train_config(steps=2, out=out, **ray_overrides(2), **extra))
    pool, mixture = trainer.pool, trainer.mixture
    assert pool is not None and mixture is not None
    assert mixture.fixed.loaded == 0  # the driver loaded no fixed model
    assert {i.fixed_loaded for i in pool.worker_info()} == {1}  # every worker did
    calls: list[tuple[str, str | None, set[int]]] = []
    orig = pool._rollout

    def spy(method, args):
        results = orig(method, args)
        calls.append((method, args[0][-1], {r.worker for r in results}))
        return results

    monkeypatch.setattr(pool, "_rollout", spy)
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
    method = "play" if multi_turn else "generate"
    by_policy = {p for m, p, _ in calls if m == method}
    assert by_policy == {None, "fixed"}, calls  # both policies' rollouts went to the workers
    assert all(workers <= {0, 1} for _, _, workers in calls)
    # The support gap of the top-k sampler needed the fixed model in the driver; else none.
    assert mixture.fixed.loaded == (0 if multi_turn else 1)
    if not multi_turn:
        assert any(r.get("actor/is_support_gap", 0) > 0 for r in recs)
