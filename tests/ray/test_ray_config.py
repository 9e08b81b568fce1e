"""Ray mode settings the config refuses, and the pure helpers of the pool (no cluster needed)."""

from __future__ import annotations

import pickle

import pytest
import torch

from toolgrpo.config.loader import ConfigError, load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.config.validate import validate_train_config
from toolgrpo.distributed.chunks import CallSeeds, split_even, weights_to_send
from toolgrpo.distributed.pool import worker_env
from toolgrpo.envs.base import EnvStart
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.rollback import NegativeSample
from toolgrpo.router.families import FamilyMap
from toolgrpo.router.runtime import RouteCondition

pytestmark = pytest.mark.ray

RAY = {"trainer.distributed.backend": "ray"}


def _config(**over: str) -> TrainConfig:
    return load_config(TrainConfig, None, [f"{k}={v}" for k, v in {**RAY, **over}.items()])


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"trainer.distributed.num_rollout_workers": "0"}, "num_rollout_workers"),
        ({"trainer.distributed.call_timeout_s": "0"}, "call_timeout_s"),
        ({"trainer.distributed.max_worker_restarts": "-1"}, "max_worker_restarts"),
        ({"trainer.distributed.backend": "spark"}, "trainer.distributed.backend"),
    ],
)
def test_unusable_ray_settings_are_refused(over, match):
    with pytest.raises(ConfigError, match=match):
        validate_train_config(_config(**over))


def test_split_even_is_contiguous_balanced_and_ordered():
    assert split_even(5, 2) == [(0, 3), (3, 5)]
    assert split_even(2, 4) == [(0, 1), (1, 2)]  # no empty chunks
    assert split_even(0, 3) == []
    for n in range(1, 12):
        for k in range(1, 5):
            r = split_even(n, k)
            assert r[0][0] == 0 and r[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(r, r[1:], strict=False))
            sizes = [e - s for s, e in r]
            assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_call_seeds_follow_the_trainer_seed():
    seeds = CallSeeds(run_seed=3)
    torch.manual_seed(11)
    first = seeds.next(2)
    second = seeds.next(2)
    assert first[0] == 11  # a local rollout right after the re-seed would sample from it
    assert len(set(first + second)) == 4
    torch.manual_seed(11)
    assert seeds.next(2) == first and seeds.next(2) == second  # a function of the step's seed


def test_weights_to_send_is_the_adapter_for_lora_and_everything_otherwise(tiny_model_dir):
    from toolgrpo.config.schema import ModelConfig
    from toolgrpo.models.loading import load_policy

    full = load_policy(ModelConfig(path=str(tiny_model_dir), dtype="float32"))
    state = full.model.state_dict()
    sent = weights_to_send(full.model)
    assert sent.tensors().keys() == state.keys()
    for k, v in sent.tensors().items():
        torch.testing.assert_close(v, state[k], rtol=0, atol=0)
    lora = load_policy(ModelConfig(path=str(tiny_model_dir), dtype="float32", lora_rank=4))
    adapter = weights_to_send(lora.model).tensors()
    assert adapter and all("lora_" in k for k in adapter)
    assert set(adapter) <= set(lora.model.state_dict())


def test_weight_payload_keeps_bf16_and_sends_tied_tensors_once():
    emb = torch.nn.Embedding(7, 3).to(torch.bfloat16)
    head = torch.nn.Linear(3, 7, bias=False).to(torch.bfloat16)
    head.weight = emb.weight  # tied, as in SmolLM2
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    sent = pickle.loads(pickle.dumps(weights_to_send(model)))
    assert sent.aliases == {"head.weight": "emb.weight"} and len(sent.arrays) == 1
    got = sent.tensors()
    assert got["head.weight"].dtype == torch.bfloat16
    torch.testing.assert_close(got["head.weight"], emb.weight.detach(), rtol=0, atol=0)


def test_what_crosses_to_the_workers_pickles():
    ep = Episode("t", "calculator", "u", [1, 2], [3], [1], [-0.5])
    ep.negatives.append(
        NegativeSample("t", "c", "u", [1], [2], [1], [-1.0], ["e"], ["x"], "turn_1", 1, 0, [], 0)
    )
    assert pickle.loads(pickle.dumps(ep)) == ep
    cond = RouteCondition("ANSWER", FamilyMap())
    start = EnvStart([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    assert pickle.loads(pickle.dumps(cond))(start) == cond(start)


def test_worker_env_forwards_caches_and_threads_but_no_tokens(monkeypatch):
    monkeypatch.setenv("TOOLGRPO_CACHE", "/tmp/c")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_TOKEN", "secret")
    monkeypatch.setenv("UNRELATED", "x")
    env = worker_env(2)
    assert env["TOOLGRPO_CACHE"] == "/tmp/c" and env["HF_HUB_OFFLINE"] == "1"
    assert env["OMP_NUM_THREADS"] == "2"
    assert "HF_TOKEN" not in env and "UNRELATED" not in env


def test_a_worker_in_process_loads_weights_and_generates(make_train_config):
    """The actor class is plain Python: its logic runs (and is checked) without a cluster."""
    from toolgrpo.distributed.worker import RolloutWorker
    from toolgrpo.models.loading import load_policy
    from toolgrpo.rollout.generator import SamplingParams

    cfg = make_train_config()
    worker = RolloutWorker(cfg, index=0)
    assert worker.ping().version == -1 and worker.ping().eos_ids
    moved = load_policy(cfg.actor_rollout_ref.model)
    with torch.no_grad():
        for p in moved.model.parameters():
            p.mul_(1.5)
    assert worker.set_weights(4, weights_to_send(moved.model)) == 4
    for k, v in moved.model.state_dict().items():
        torch.testing.assert_close(worker.policy.model.state_dict()[k], v, rtol=0, atol=0)
    res = worker.generate([[1, 2, 3], [4, 5]], SamplingParams(n=2, max_new_tokens=3), seed=9)
    assert res.version == 4 and [c.prompt_index for c in res.items] == [0, 0, 1, 1]
    again = worker.generate([[1, 2, 3], [4, 5]], SamplingParams(n=2, max_new_tokens=3), seed=9)
    assert [c.token_ids for c in again.items] == [c.token_ids for c in res.items]
    worker.inject_fault("raise")
    with pytest.raises(ValueError, match="injected fault"):
        worker.generate([[1]], SamplingParams(), seed=0)
