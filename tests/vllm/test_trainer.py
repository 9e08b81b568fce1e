"""GRPO with ``rollout.name=vllm`` on SmolLM2 + the shipped LoRA warm start: the trainer builds
its generator on the session engine (same engine settings), pushes the merged adapter at start
and after every update, and the engine ends the run sampling exactly the trained actor."""

from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import read_metrics
from tests.vllm.conftest import vllm_train_overrides
from toolgrpo.rollout.generator import SamplingParams

pytestmark = pytest.mark.vllm


def test_two_grpo_steps_with_vllm_rollouts(session_gen, tiny_data, prompts, tmp_path):
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig
    from toolgrpo.models.logprobs import response_logprobs
    from toolgrpo.rollout.vllm_backend import VLLMGenerator
    from toolgrpo.trainer.trainer import Trainer

    out = tmp_path / "run"
    trainer = Trainer(load_config(TrainConfig, None, vllm_train_overrides(tiny_data, out)))
    try:
        gen = trainer.generator
        assert isinstance(gen, VLLMGenerator) and trainer.policy.is_lora
        assert gen.llm is session_gen.llm  # same settings: the live engine is shared
        start = {k: v.clone() for k, v in trainer.policy.model.state_dict().items() if "lora_" in k}
        trainer.fit()
        recs = read_metrics(out)
        assert [r["step"] for r in recs] == [1, 2]
        for r in recs:
            for key in ("reward/mean", "actor/pg_loss", "timing/gen_s", "timing/weight_sync_s"):
                assert math.isfinite(r[key]), key
            assert r["timing/weight_sync_s"] > 0
            assert r["actor/old_logprob_reused"] == 0.0
            assert r["rollout/logprob_diff_mean"] < 1e-3  # vLLM's log-probs = the actor's
        assert gen.syncs == 3  # at start (the warm start's adapter), then after each update
        trained = trainer.policy.model.state_dict()
        assert any(not torch.equal(trained[k], v) for k, v in start.items())

        torch.manual_seed(0)
        for c in gen.generate(prompts, SamplingParams(n=2, max_new_tokens=8)):
            ids = torch.tensor([c.prompt_ids + c.token_ids])
            with torch.no_grad():
                want = response_logprobs(
                    trainer.policy.base, ids, torch.ones_like(ids), len(c.token_ids)
                ).logprobs_BR[0]
            torch.testing.assert_close(torch.tensor(c.logprobs), want, rtol=0, atol=1e-3)
    finally:
        trainer.close()
    assert gen._engine is None and session_gen.llm is not None  # the session still holds it
