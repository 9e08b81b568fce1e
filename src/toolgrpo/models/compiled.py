"""``actor_rollout_ref.actor.use_torch_compile``: torch.compile the memory-bound pieces of the
actor's forward and backward, leave the rest eager.

On CPU an update's GEMMs run near the machine's peak; much of the rest is elementwise work that
eager PyTorch does one pass per op (RMSNorm's casts and reductions, the MLP's activation and
product, LoRA's scaling, the LM head's float cast, log-sum-exp and softmax). Inductor fuses those
passes. Only blocks without a KV cache are compiled: the norms, MLPs and LoRA projections of every
layer (in place, so parameter names, checkpoints and weight pushes are unchanged) and the LM head's
per-chunk statistics (``toolgrpo.models.logprobs``). A whole decoder layer is not: its cache
update and per-layer index make dynamo recompile for every layer until it gives up.

Shapes are dynamic (one graph serves every micro-batch width); the first update pays the compile
(tens of seconds on a 2-core CPU, cached on disk by inductor afterwards)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

# Module classes compiled in place, by name suffix (LlamaRMSNorm, Qwen2MLP, ...): stateless blocks
# that every decoder family has.
COMPILED_SUFFIXES = ("RMSNorm", "MLP")


def compile_training_blocks(model: torch.nn.Module) -> int:
    """Compile every norm and MLP module of ``model`` in place, and every LoRA projection outside
    them (attention's q/k/v/o: the adapter's casts, scaling and sum); the number compiled."""
    from peft.tuners.lora import LoraLayer

    done: list[str] = []
    for name, mod in model.named_modules():
        if any(name.startswith(d + ".") for d in done):
            continue  # inside a compiled block: traced with it
        if type(mod).__name__.endswith(COMPILED_SUFFIXES) or isinstance(mod, LoraLayer):
            mod.compile(dynamic=True)
            done.append(name)
    return len(done)


@functools.cache
def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` compiled once per process (dynamic shapes)."""
    return torch.compile(fn, dynamic=True)
