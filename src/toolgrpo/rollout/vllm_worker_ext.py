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

    def toolgrpo_threads(self) -> int:
        """The engine process's torch thread count (what its CPU kernels run on)."""
        import torch

        return torch.get_num_threads()

    def toolgrpo_exit_with_parent(self, parent_pid: int) -> int:
        """Have the kernel kill this engine process when the trainer process dies (Linux), so
        a trainer killed outright (OOM, SIGKILL) leaves no engine holding gigabytes of memory:
        vLLM's engine core otherwise outlives its parent. Returns this process's pid, or 0
        when that cannot be arranged (not Linux, or the trainer is not the parent)."""
        import ctypes
        import os
        import signal
        import sys

        if not sys.platform.startswith("linux") or os.getppid() != parent_pid:
            return 0
        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(pr_set_pdeathsig, signal.SIGKILL) != 0:
            return 0
        if os.getppid() != parent_pid:  # the trainer died before the call took effect
            os._exit(1)
        return os.getpid()
