"""vLLM's async engine (``actor_rollout_ref.rollout.mode=async``): each turn of each episode is its
own request, joining the running batch at the engine's next step (continuous batching). An episode
back from its tools starts its next turn at once instead of waiting for a whole wave of other
turns to finish, as it does with the in-process engine behind ``GenerationBatcher``.

``AsyncLLM`` always runs its engine core in a child process, so weights cross a process boundary:
the trainer writes them to one safetensors file (in /dev/shm when it exists) and the worker reloads
from it (``vllm_worker_ext``). The engine lives on one event loop in its own thread for the
generator's whole life; callers in other loops (every trainer step runs its own) reach it through
``run_coroutine_threadsafe``. Samples, seeds and log-probs follow ``VLLMGenerator`` exactly.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from toolgrpo.config.schema import TrainConfig
from toolgrpo.rollout.generator import Completion, SamplingParams
from toolgrpo.rollout.hf import stop_token_ids
from toolgrpo.rollout.vllm_backend import (
    MAX_SEED,
    check_prompts,
    completions,
    engine_args,
    engine_key,
    process_state_kept,
    sampling_request,
    set_engine_env,
)
from toolgrpo.rollout.vllm_compat import eager_engine_start, env_default, kernel_scan_safe
from toolgrpo.rollout.vllm_weights import actor_weights, save_weights
from toolgrpo.rollout.vllm_worker_ext import EXTENSION

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class _AsyncEngine:
    """A live ``AsyncLLM``, the loop and thread it lives on, and its weights file's directory;
    shared by the generators built on the same settings in this process."""

    key: tuple
    llm: Any
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    weights_dir: str
    engine_pid: int = 0  # the engine core process, when it is bound to die with this one
    engine_threads: int = 0  # its torch threads
    users: int = 0
    pushed_by: object = None
    pushed_version: int | None = None

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the engine's loop and wait for it (from a thread with no loop)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def acall(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the engine's loop from another loop; cancelling aborts it there."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))


_ENGINES: dict[tuple, _AsyncEngine] = {}


def _weights_dir() -> str:
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    return tempfile.mkdtemp(prefix="toolgrpo-vllm-weights-", dir=base)


def _engine_for(args: dict[str, Any], key: tuple) -> _AsyncEngine:
    eng = _ENGINES.get(key)
    if eng is None:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="toolgrpo-vllm-async", daemon=True)
        thread.start()

        async def start() -> Any:  # built on its loop: its output handler task lives there
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM

            with process_state_kept(), kernel_scan_safe():
                return AsyncLLM.from_engine_args(
                    AsyncEngineArgs(**args, worker_extension_cls=EXTENSION)
                )

        t0 = time.time()
        try:
            with _child_threads(torch.get_num_threads()):
                llm = asyncio.run_coroutine_threadsafe(start(), loop).result()
        except BaseException:
            _stop_loop(loop, thread)
            raise
        eng = _AsyncEngine(key, llm, loop, thread, _weights_dir())
        eng.engine_pid = _bind_to_this_process(eng)
        (eng.engine_threads,) = eng.call(eng.llm.collective_rpc("toolgrpo_threads"))
        log.info(
            "vLLM async engine ready in %.1f s (%s, pid %d, %d threads)",
            time.time() - t0,
            args["dtype"],
            eng.engine_pid,
            eng.engine_threads,
        )
        _ENGINES[key] = eng
    eng.users += 1
    return eng


@contextmanager
def _child_threads(threads: int) -> Iterator[None]:
    """The engine process is spawned and sizes its thread pool from ``OMP_NUM_THREADS`` (or
    takes every core): give it this process's torch thread count (``trainer.num_threads``), as
    the in-process engine gets, unless the user set ``OMP_NUM_THREADS`` themselves."""
    with env_default("OMP_NUM_THREADS", str(threads)):
        yield


def _bind_to_this_process(eng: _AsyncEngine) -> int:
    """The engine core process dies with this one (see ``toolgrpo_exit_with_parent``)."""
    (pid,) = eng.call(eng.llm.collective_rpc("toolgrpo_exit_with_parent", args=(os.getpid(),)))
    if not pid:
        log.warning(
            "the vLLM engine process could not be bound to die with this one: if this process "
            "is killed outright, kill the engine process (VLLM::EngineCore) by hand"
        )
    return int(pid)


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=30)
    if not thread.is_alive():
        loop.close()


def _shutdown(eng: _AsyncEngine) -> None:
    _ENGINES.pop(eng.key, None)

    async def stop() -> None:
        eng.llm.shutdown()

    try:
        eng.call(stop())
    finally:
        eng.llm = None
        _stop_loop(eng.loop, eng.thread)
        shutil.rmtree(eng.weights_dir, ignore_errors=True)


class AsyncVLLMGenerator:
    """A ``Generator`` on vLLM's async engine, with ``agenerate`` for one prompt at a time
    (what ``GenerationBatcher`` calls per episode turn); ``sync_weights`` pushes the actor's."""

    def __init__(self, engine: _AsyncEngine, tokenizer: Any, max_len: int) -> None:
        self._engine: _AsyncEngine | None = engine
        self.tokenizer = tokenizer
        self.max_model_len = max_len
        self.eos_ids = stop_token_ids(tokenizer)
        self._token = object()
        self._weights: tuple[Any, int] | None = None  # the model and version last synced
        self.last_sync_s = 0.0
        self.syncs = 0

    @classmethod
    def from_config(cls, cfg: TrainConfig, policy: Any) -> AsyncVLLMGenerator:
        """An engine on the policy's base model, then the policy's own weights pushed into it."""
        on_gpu = torch.cuda.is_available()
        set_engine_env(cfg, on_gpu)
        args = engine_args(cfg, str(policy.resolved.hf_dir), on_gpu)
        key = engine_key(args, policy.tokenizer)  # same model shape + settings: one engine
        eager = not on_gpu and cfg.actor_rollout_ref.rollout.enforce_eager
        with eager_engine_start(eager):  # the spawned engine process inherits it
            engine = _engine_for(args, key)
        gen = cls(engine, policy.tokenizer, args["max_model_len"])
        gen.sync_weights(policy.model, 0)
        return gen

    def _live(self) -> _AsyncEngine:
        if self._engine is None:
            raise RuntimeError("this AsyncVLLMGenerator is closed")
        return self._engine

    def claim_engine(self) -> None:
        """Make the shared engine hold this generator's weights again if another generator on
        it (a mixture's fixed policy, or the actor) pushed its own since (issue #17)."""
        eng = self._engine
        if eng is not None and self._weights is not None and eng.pushed_by is not self._token:
            self.sync_weights(*self._weights)

    def sync_weights(self, model: Any, version: int) -> None:
        """Push ``model``'s weights unless this generator already pushed this ``version``. Call
        it between steps: requests in flight would mix versions."""
        eng = self._live()
        self._weights = (model, version)
        if eng.pushed_by is self._token and eng.pushed_version == version:
            return
        t0 = time.time()
        path = os.path.join(eng.weights_dir, "model.safetensors")
        save_weights(actor_weights(model), path)

        async def push() -> None:
            await eng.llm.collective_rpc("toolgrpo_load_weights", args=(path,))
            # Prefix caching would otherwise reuse prompt KV computed with the previous weights.
            await eng.llm.reset_prefix_cache()

        try:
            eng.call(push())
        finally:
            os.remove(path)  # the file is as large as the model; the engine has copied it
        eng.pushed_by, eng.pushed_version = self._token, version
        self.last_sync_s = time.time() - t0
        self.syncs += 1

    async def agenerate(self, prompt: list[int], params: SamplingParams) -> list[Completion]:
        """``params.n`` completions of ``prompt``, from any event loop."""
        check_prompts([prompt], self.max_model_len)
        seed = int(torch.randint(0, MAX_SEED, (1,)))  # torch's RNG, as VLLMGenerator
        eng = self._live()
        return await eng.acall(self._request(eng, 0, prompt, params, seed))

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """The ``Generator`` contract: all prompts in flight at once, results in prompt order."""
        if not prompts:
            return []
        check_prompts(prompts, self.max_model_len)
        seeds = torch.randint(0, MAX_SEED, (len(prompts),)).tolist()
        eng = self._live()

        async def every() -> list[list[Completion]]:
            jobs = (
                self._request(eng, i, p, params, s)
                for i, (p, s) in enumerate(zip(prompts, seeds, strict=True))
            )
            return list(await asyncio.gather(*jobs))

        return [c for group in eng.call(every()) for c in group]

    async def _request(
        self, eng: _AsyncEngine, index: int, prompt: list[int], params: SamplingParams, seed: int
    ) -> list[Completion]:
        """One request, on the engine's loop."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        req = sampling_request(params, len(prompt), seed, self.max_model_len, self.eos_ids)
        req.output_kind = RequestOutputKind.FINAL_ONLY
        final = None
        inputs = TokensPrompt(prompt_token_ids=list(prompt))
        async for out in eng.llm.generate(inputs, req, uuid.uuid4().hex):
            final = out
        if final is None or not final.finished:
            raise RuntimeError("vLLM's async engine ended a request without a final output")
        return completions(index, prompt, final, params, self.eos_ids)

    def close(self) -> None:
        """Release the engine; the last generator on it shuts its process down."""
        eng, self._engine = self._engine, None
        if eng is None:
            return
        eng.users -= 1
        if eng.users <= 0:
            _shutdown(eng)
