"""The fixed policy samples on the actor's vLLM backend (issue #17, item 7; on main it always
sampled with HF). The base SmolLM2 as fixed policy and the LoRA warm start as actor share one
engine: each part of a step must sample with its own weights, which the recorded log-probs show
(fixed rows match the base model at temperature 0.8, actor rows the actor)."""

from __future__ import annotations

import pytest
import torch

from tests.vllm.conftest import recompute, vllm_train_overrides

pytestmark = pytest.mark.vllm


def test_fixed_policy_samples_on_the_shared_vllm_engine(
    session_gen, hf_policy, tiny_data, tmp_path
):
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig
    from toolgrpo.rollout.vllm_backend import VLLMGenerator
    from toolgrpo.trainer.trainer import Trainer

    over = vllm_train_overrides(
        tiny_data,
        tmp_path / "mix",
        **{
            "rollout_only.model_path": "smollm2-135m",
            "rollout_only.temperature": "0.8",
            "rollout_allocation_schedule.alpha": "0.5",
            "rollout_allocation_schedule.per_sample": "true",
            "rollout_allocation_schedule.seed": "0",  # step 1: 3 fixed groups, 1 actor
            "data.train_batch_size": "4",
            "actor_rollout_ref.actor.ppo_mini_batch_size": "2",
            "trainer.total_training_steps": "1",
        },
    )
    trainer = Trainer(load_config(TrainConfig, None, over))
    seen = []
    orig = trainer.actor.update

    def update(batch):
        seen.append(batch)
        return orig(batch)

    trainer.actor.update = update
    try:
        fixed_gen = trainer.mixture.fixed.generator("fixed")
        assert isinstance(fixed_gen, VLLMGenerator)
        assert fixed_gen.llm is trainer.generator.llm is session_gen.llm  # one shared engine
        (rec,) = trainer.fit()
        (b,) = seen
        fixed = [i for i, p in enumerate(b.policies) if p != "actor"]
        actor = [i for i, p in enumerate(b.policies) if p == "actor"]
        assert fixed and actor, b.policies
        assert rec["rollout/logprob_diff_mean"] < 1e-3  # actor rows: the actor's weights
        r = b.response_length
        for i in fixed:
            n = int(b.response_mask_BR[i].sum())
            ids = b.input_ids_BT[i][b.attention_mask_BT[i].bool()].tolist()
            resp = b.input_ids_BT[i, -r:][:n].tolist()
            comp = type("C", (), {"prompt_ids": ids[: len(ids) - n], "token_ids": resp})
            want = recompute(hf_policy.model, comp, 0.8)[0]
            got = b.rollout_logprobs_BR[i, :n]
            torch.testing.assert_close(got, want.float(), rtol=0, atol=2e-3)
    finally:
        trainer.close()


def test_a_fixed_policy_saved_as_its_own_model_dir_shares_the_engine(
    engine_cfg, session_gen, hf_policy, prompts, tmp_path
):
    """A fine-tuned checkpoint's ``model/`` directory is another path with the same config and
    tokenizer: it samples on the live engine with its own weights (two in-process engines
    cannot run side by side), and the actor's generator takes the engine back."""
    import copy

    from tests.vllm.conftest import BASE_VERSION, perturbed
    from toolgrpo.config.schema import ModelConfig
    from toolgrpo.models.loading import load_policy
    from toolgrpo.rollout.generator import SamplingParams
    from toolgrpo.rollout.vllm_backend import _ENGINES, VLLMGenerator

    saved = tmp_path / "checkpoint_model"
    with perturbed(hf_policy.model, ["model.norm.weight"], scale=5.0, seed=3):
        copy.deepcopy(hf_policy.model).save_pretrained(saved)
    hf_policy.tokenizer.save_pretrained(saved)
    fixed = load_policy(ModelConfig(path=str(saved), dtype="float32"), trainable=False)
    engines = len(_ENGINES)
    gen = VLLMGenerator.from_config(engine_cfg, fixed)
    try:
        assert gen.llm is session_gen.llm and len(_ENGINES) == engines
        params = SamplingParams(n=1, temperature=1.0, max_new_tokens=6)
        session_gen.sync_weights(hf_policy.model, BASE_VERSION)
        for g, own, other in (
            (gen, fixed.model, hf_policy.model),
            (session_gen, hf_policy.model, fixed.model),
            (gen, fixed.model, hf_policy.model),  # each takes the engine back from the other
        ):
            (c,) = g.generate(prompts[:1], params)
            got = torch.tensor(c.logprobs)
            torch.testing.assert_close(got, recompute(own, c)[0], rtol=0, atol=2e-3)
            assert (got - recompute(other, c)[0]).abs().max() > 0.05  # the weights differ
    finally:
        gen.close()
    assert session_gen.llm is not None  # the session engine outlives the fixed generator
