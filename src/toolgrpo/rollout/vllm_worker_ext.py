"""Methods vLLM adds to its model worker (``worker_extension_cls``), for an engine whose worker
runs in another process (the async engine): the trainer calls them by name through
``collective_rpc``, so nothing is pickled but a file path."""

from __future__ import annotations

from typing import Any

EXTENSION = "toolgrpo.rollout.vllm_worker_ext.WeightSyncExtension"


class WeightSyncExtension:
    """Mixed into vLLM's worker class; ``self`` is the worker."""

    def toolgrpo_load_weights(self, path: str) -> int:
        """Reload the model from the safetensors file at ``path`` (see
        ``vllm_weights.save_weights``); returns the number of tensors read."""
        from safetensors.torch import load_file

        from toolgrpo.rollout.vllm_weights import reload_into_worker

        weights = load_file(path)
        worker: Any = self
        reload_into_worker(worker, iter(weights.items()))
        return len(weights)
