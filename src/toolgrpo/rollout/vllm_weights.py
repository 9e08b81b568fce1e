"""Actor weights → an in-process vLLM engine.

The engine keeps its own copy of the weights (on CPU, repacked for oneDNN), so after every actor
update the trainer's tensors are streamed into it with ``Worker.reload_weights``, the one update
path that survives the CPU repacking (``model.load_weights`` does not, ``sleep``/``wake_up`` are
no-ops on CPU; see docs/vllm_cpu_probe.md).

A PEFT LoRA actor is pushed as merged weights (W + scaling·B@A under the base checkpoint's names)
rather than as a vLLM LoRA adapter: the merged model samples at base-model speed (no per-token
LoRA kernels), needs no adapter files written and re-registered under a fresh id every step, and
goes through the same reload path as full fine-tuning. The trainer's module is only read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch

# Submodule names under which PEFT keeps the adapter's own tensors (never pushed).
_LORA_PARTS = (
    ".lora_A.",
    ".lora_B.",
    ".lora_embedding_A.",
    ".lora_embedding_B.",
    ".lora_magnitude_vector.",
)


def actor_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """``(checkpoint name, tensor)`` for every weight of ``model``: a ``*ForCausalLM`` as is, a
    ``peft.PeftModel`` merged. Tensors may alias the module's: the engine copies them."""
    if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):
        yield from merged_lora_weights(model)
        return
    for name, t in model.state_dict().items():
        yield name, t.detach()


def _lora_deltas(base: Any) -> dict[str, torch.Tensor]:
    """``module name → scaling·B@A`` summed over the active adapters of every unmerged layer."""
    from peft.tuners.lora import LoraLayer

    deltas: dict[str, torch.Tensor] = {}
    for name, mod in base.named_modules():
        if not isinstance(mod, LoraLayer) or mod.merged or mod.disable_adapters:
            continue
        for adapter in mod.active_adapters:
            if adapter not in mod.lora_A and adapter not in mod.lora_embedding_A:
                continue
            if adapter in mod.lora_variant or mod.lora_bias.get(adapter, False):
                raise NotImplementedError(
                    f"{name}: LoRA variants (DoRA, ...) and lora_bias are not merged for vLLM; "
                    "use actor_rollout_ref.rollout.name=hf"
                )
            delta = mod.get_delta_weight(adapter).float()
            deltas[name] = deltas[name] + delta if name in deltas else delta
    return deltas


@torch.no_grad()
def merged_lora_weights(peft_model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights ``merge_and_unload`` would produce, computed without touching the module:
    ``q_proj.base_layer.weight`` + delta is yielded as ``q_proj.weight``."""
    base = peft_model.get_base_model()
    deltas = _lora_deltas(base)
    for key, t in base.state_dict().items():
        if any(p in key for p in _LORA_PARTS) or ".original_module." in key:
            continue
        t = t.detach()
        if ".modules_to_save." in key:  # the trained copy of a fully-trained module
            head, _, rest = key.partition(".modules_to_save.")
            key = f"{head}.{rest.split('.', 1)[1]}"
        if ".base_layer." in key:
            module, _, leaf = key.partition(".base_layer.")
            key = f"{module}.{leaf}"
            if leaf == "weight" and module in deltas:
                t = t.float() + deltas[module]
        yield key, t


class _ExpectedReloadWarnings(logging.Filter):
    """Every reload warns "<layer>: Failed to load weights" for two layers that have no checkpoint
    key by design: the rotary cache (computed) and a tied LM head (``refresh_tied_head``)."""

    LAYERS = frozenset({"RotaryEmbedding", "ParallelLMHead"})

    def filter(self, record: logging.LogRecord) -> bool:
        expected = record.msg == "%s: Failed to load weights" and record.args
        return not (expected and record.args[0] in self.LAYERS)  # type: ignore[index]


_FILTER = _ExpectedReloadWarnings()


def driver_worker(llm: Any) -> Any:
    """The engine's in-process GPU/CPU worker; only an in-process engine has one."""
    executor = getattr(llm.llm_engine, "model_executor", None)
    wrapper = getattr(executor, "driver_worker", None)
    worker = getattr(wrapper, "worker", None)
    if worker is None:
        raise RuntimeError(
            "vLLM weight sync needs the in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0, "
            "tensor_model_parallel_size=1); this engine runs its workers in other processes"
        )
    return worker


def push_weights(llm: Any, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Load ``weights`` into ``llm``'s model, refresh the tied LM head, drop cached prefixes."""
    reload_into_worker(driver_worker(llm), weights)
    # Prefix caching would otherwise reuse prompt KV computed with the previous weights.
    llm.reset_prefix_cache()


def reload_into_worker(worker: Any, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
    """``Worker.reload_weights`` from checkpoint-named tensors, then the tied-head refresh. Runs
    wherever the worker lives: this process (``push_weights``) or an engine-core process
    (``vllm_worker_ext``)."""
    reload_log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if _FILTER not in reload_log.filters:
        reload_log.addFilter(_FILTER)
    dtype = getattr(getattr(worker, "model_config", None), "dtype", None)
    if isinstance(dtype, torch.dtype):  # fp32 actor, bf16 engine: vLLM warns per weight
        weights = in_dtype(weights, dtype)
    worker.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    model = worker.model_runner.model
    if getattr(model.config, "tie_word_embeddings", False):
        refresh_tied_head(model)


def in_dtype(
    weights: Iterator[tuple[str, torch.Tensor]], dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """Floating-point tensors cast to the engine's dtype, one at a time (never a second full
    copy of the model); integer buffers as they are."""
    for name, t in weights:
        yield name, t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t


def save_weights(weights: Iterator[tuple[str, torch.Tensor]], path: str) -> int:
    """Write ``weights`` as one safetensors file (for an engine in another process); a tensor
    that aliases one already written (a tied LM head) is left out, as checkpoints do. Returns
    the number of tensors written."""
    from safetensors.torch import save_file

    seen: set[tuple[int, tuple[int, ...], tuple[int, ...]]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, t in weights:
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()))
        if key in seen:
            continue
        seen.add(key)
        out[name] = t.contiguous()
    save_file(out, path)
    return len(out)


def refresh_tied_head(model: Any) -> None:
    """The checkpoint has no ``lm_head`` key when embeddings are tied, so a reload never
    re-processes the head. On CPU its logits go through a oneDNN handle built when the head was
    last processed; where oneDNN keeps a packed copy of the weight, logits silently use the *old*
    embedding (seen in docs/vllm_cpu_probe.md). With fp32 on this AVX2 machine the handle reads
    the live tensor and this is a no-op, but the packing is oneDNN's choice per ISA and dtype,
    so the head is re-tied and re-processed after every reload."""
    head, embed = model.lm_head, model.model.embed_tokens
    head.weight = embed.weight
    method = getattr(head, "quant_method", None)
    if method is not None:
        method.process_weights_after_loading(head)
