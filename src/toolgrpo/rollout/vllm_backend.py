"""vLLM generation backend (``actor_rollout_ref.rollout.name=vllm``): an in-process engine that
samples the actor's rollouts from weights pushed after every update.

It keeps HFGenerator's contract exactly: ``n`` completions per prompt grouped in prompt order, a
sampled stop token is included, and log-probs are those of the distribution each token was drawn
from (after temperature and top-k/top-p: the engine's ``processed_logprobs`` mode), because they
are importance-sampling denominators. Per-request seeds come from torch's global RNG, which the
trainer seeds, so rollouts replay on resume.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so a weight push is a
tensor copy, not a serialisation round trip. One engine per (model shape, engine settings) is
kept per process and shared by every generator built on it: vLLM engines are heavy (KV cache, a
torch.distributed group), tests and benchmarks build several trainers in one process, and a
mixture's fixed policy saved as its own model directory (a checkpoint's ``model/``) samples on
the actor's engine. Every generator pushes its own weights before it samples, so the directory an
engine was built from only matters through its config and tokenizer (``engine_key``).
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from toolgrpo.config.loader import ConfigError
from toolgrpo.config.schema import TrainConfig
from toolgrpo.rollout.generator import Completion, SamplingParams
from toolgrpo.rollout.hf import stop_token_ids
from toolgrpo.rollout.vllm_compat import (
    eager_engine_start,
    kernel_scan_safe,
    process_group_kept,
    release_parallel_state,
)
from toolgrpo.rollout.vllm_weights import actor_weights, push_weights
from toolgrpo.run_log import quiet_libraries

log = logging.getLogger(__name__)

MAX_SEED = 2**31 - 1


def set_engine_env(cfg: TrainConfig, on_gpu: bool) -> None:
    """Environment vLLM reads at import/engine start; values already set win (a user's tuning)."""
    quiet_libraries(cfg.trainer.verbose)  # vLLM's logs through ours: run.log, quiet console
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: direct weight sync
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    if on_gpu:
        return
    # "auto" binding reserves a core for the scheduler: on a 2-core machine, half the compute.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def engine_dtype(name: str, on_gpu: bool) -> str:
    """``auto``: bf16 on GPUs and CPUs with native bf16; fp32 elsewhere (emulated bf16 on AVX2
    loses the oneDNN GEMM and runs ~5x slower)."""
    from toolgrpo.models.loading import cpu_has_native_bf16

    if name != "auto":
        return name
    return "bfloat16" if on_gpu or cpu_has_native_bf16() else "float32"


def max_model_len(cfg: TrainConfig) -> int:
    r, d = cfg.actor_rollout_ref.rollout, cfg.data
    return r.max_model_len if r.max_model_len > 0 else d.max_prompt_length + d.max_response_length


def engine_args(cfg: TrainConfig, model_dir: str, on_gpu: bool) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments for ``cfg`` (verl's key names map one to one)."""
    r = cfg.actor_rollout_ref.rollout
    if r.tensor_model_parallel_size != 1:
        raise ValueError(
            "actor_rollout_ref.rollout.tensor_model_parallel_size must be 1: weight sync needs "
            "the in-process engine"
        )
    args: dict[str, Any] = {
        "model": model_dir,
        "tokenizer": model_dir,
        "dtype": engine_dtype(r.dtype, on_gpu),
        "enforce_eager": r.enforce_eager,
        "max_model_len": max_model_len(cfg),
        "max_num_seqs": r.max_num_seqs,
        "seed": cfg.trainer.seed,
        "enable_prefix_caching": r.enable_prefix_caching,
        "tensor_parallel_size": r.tensor_model_parallel_size,
        # Log-probs of the distribution actually sampled (temperature, top-k/top-p applied).
        "logprobs_mode": "processed_logprobs",
        # Stop on exactly stop_token_ids(tokenizer), like HFGenerator, not on extra ids a
        # generation_config.json may list; and no sampling defaults taken from it.
        "generation_config": "vllm",
        "use_tqdm_on_load": cfg.trainer.verbose,  # the shard-loading bar: console noise
    }
    if on_gpu:
        args["gpu_memory_utilization"] = r.gpu_memory_utilization
    else:
        # The CPU KV cache is a fixed size (VLLM_CPU_KVCACHE_SPACE, whole GiB, wins when set).
        if r.cpu_kvcache_space_gb <= 0:
            raise ValueError("actor_rollout_ref.rollout.cpu_kvcache_space_gb must be > 0")
        args["kv_cache_memory_bytes"] = int(r.cpu_kvcache_space_gb * 2**30)
        # Seeded requests get CPU torch generators here, and vLLM rewinds the generator of a
        # partly prefilled (chunked) request by an offset CPU generators lack ("CPU Generator
        # does not use offset": a step with ~6k prompt tokens crashed). Prefill whole prompts.
        args["enable_chunked_prefill"] = False
        args["max_num_batched_tokens"] = max(args["max_model_len"], 8192)
    return args


@dataclass
class _Engine:
    """A live ``vllm.LLM``, the one thread that drives it, and who pushed its current weights
    (shared by generators).

    Every engine call runs on ``thread``. vLLM-CPU's attention checks that a step runs with the
    OpenMP thread count its metadata was built with, and OpenMP counts are per thread: called
    from the multi-turn batcher's worker thread, an engine built on the main thread aborted the
    step ("thread_num 2 vs. 1"). One driving thread makes the caller's thread irrelevant."""

    key: tuple
    llm: Any
    thread: ThreadPoolExecutor
    users: int = 0
    pushed_by: object = None  # the generator token of the last push
    pushed_version: int | None = None
    owns_process_group: bool = True  # vLLM made the default group (no fsdp2 group before it)

    def run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return self.thread.submit(fn, *args, **kwargs).result()


_ENGINES: dict[tuple, _Engine] = {}
# config.json fields that name, stamp or type a saved copy without changing what it computes
# (the engine's dtype is its own setting).
_UNSHAPED = ("_name_or_path", "name_or_path", "transformers_version", "torch_dtype", "dtype")


def engine_key(args: dict[str, Any], tokenizer: Any) -> tuple:
    """What decides whether a live engine can serve a model: the engine settings without the
    model's path, the model's config.json without name, version or dtype stamps, and the
    tokenizer's vocabulary and special tokens. Two directories holding the same architecture
    (the base model and a fine-tuned checkpoint of it) give one key."""
    config = json.loads((Path(args["model"]) / "config.json").read_text())
    shape = {k: v for k, v in config.items() if k not in _UNSHAPED}
    vocab = sorted(tokenizer.get_vocab().items())
    special = sorted(tokenizer.all_special_tokens)
    digest = hashlib.sha256(json.dumps([shape, vocab, special], sort_keys=True).encode())
    settings = tuple(
        sorted((k, repr(v)) for k, v in args.items() if k not in ("model", "tokenizer"))
    )
    return (digest.hexdigest(), settings)


def _engine_for(args: dict[str, Any], key: tuple) -> _Engine:
    eng = _ENGINES.get(key)
    if eng is None:
        if _ENGINES and not torch.cuda.is_available():
            live = next(iter(_ENGINES))
            what = "model shape" if live[0] != key[0] else "engine settings"
            raise ConfigError(
                f"a second in-process vLLM engine cannot run beside a live one on CPU (vLLM "
                f"keeps one process-wide parallel state: closing either breaks the other), and "
                f"{args['model']} differs from the live engine "
                f"in its {what}: give every policy the actor's architecture, tokenizer and "
                "rollout settings, or use actor_rollout_ref.rollout.name=hf"
            )
        if _ENGINES:
            log.warning("starting a second vLLM engine in this process (%d live)", len(_ENGINES))
        from vllm import LLM

        t0 = time.time()
        thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolgrpo-vllm")
        threads = torch.get_num_threads()  # the creator's setting (tests, trainer.num_threads)

        def start() -> Any:
            torch.set_num_threads(threads)  # before vLLM's worker pins the count
            with process_state_kept(), kernel_scan_safe():
                return LLM(**args)

        owns = not (torch.distributed.is_available() and torch.distributed.is_initialized())
        try:
            eng = _Engine(key, thread.submit(start).result(), thread, owns_process_group=owns)
        except BaseException:
            thread.shutdown(wait=False)
            raise
        log.info("vLLM engine ready in %.1f s (%s)", time.time() - t0, args["dtype"])
        _ENGINES[key] = eng
    eng.users += 1
    return eng


@contextmanager
def process_state_kept() -> Iterator[None]:
    """The engine's worker reseeds the global RNGs and, to protect its OMP thread binding,
    turns ``torch.set_num_threads`` into a no-op for the whole process. The trainer shares the
    process: keep its RNG streams, and its thread control when nothing was bound (``nobind``)."""
    import random

    import numpy as np

    states = torch.get_rng_state(), random.getstate(), np.random.get_state()
    set_threads = torch.set_num_threads
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        random.setstate(states[1])
        np.random.set_state(states[2])
        if os.environ.get("VLLM_CPU_OMP_THREADS_BIND") == "nobind":
            torch.set_num_threads = set_threads


def _shutdown(eng: _Engine) -> None:
    _ENGINES.pop(eng.key, None)
    last = not _ENGINES

    def stop() -> None:
        with process_group_kept(eng.owns_process_group):
            core = getattr(eng.llm.llm_engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
            eng.llm = None
            gc.collect()
            if last:
                release_parallel_state()

    try:
        eng.run(stop)
    finally:
        eng.thread.shutdown(wait=True)


class VLLMGenerator:
    """A ``Generator`` on an in-process vLLM engine; ``sync_weights`` pushes the actor's."""

    def __init__(self, engine: _Engine, tokenizer: Any, max_len: int) -> None:
        self._engine: _Engine | None = engine
        self.tokenizer = tokenizer
        self.max_model_len = max_len
        self.eos_ids = stop_token_ids(tokenizer)
        self._token = object()  # identifies this generator's pushes on a shared engine
        self._weights: tuple[Any, int] | None = None  # the model and version last synced
        self.last_sync_s = 0.0
        self.syncs = 0

    @classmethod
    def from_config(cls, cfg: TrainConfig, policy: Any) -> VLLMGenerator:
        """An engine on the policy's base model, then the policy's own weights pushed into it
        (so a LoRA warm start, not the bare base model, is what samples)."""
        on_gpu = torch.cuda.is_available()
        set_engine_env(cfg, on_gpu)
        args = engine_args(cfg, str(policy.resolved.hf_dir), on_gpu)
        key = engine_key(args, policy.tokenizer)
        with eager_engine_start(not on_gpu and cfg.actor_rollout_ref.rollout.enforce_eager):
            engine = _engine_for(args, key)
        gen = cls(engine, policy.tokenizer, args["max_model_len"])
        gen.sync_weights(policy.model, 0)
        return gen

    @property
    def llm(self) -> Any:
        if self._engine is None:
            raise RuntimeError("this VLLMGenerator is closed")
        return self._engine.llm

    def claim_engine(self) -> None:
        """Make the shared engine hold this generator's weights again if another generator on
        it (a mixture's fixed policy, or the actor) pushed its own since (issue #17)."""
        eng = self._engine
        if eng is not None and self._weights is not None and eng.pushed_by is not self._token:
            self.sync_weights(*self._weights)

    def sync_weights(self, model: Any, version: int) -> None:
        """Push ``model``'s weights unless this generator already pushed this ``version``."""
        eng = self._engine
        if eng is None:
            raise RuntimeError("this VLLMGenerator is closed")
        self._weights = (model, version)
        if eng.pushed_by is self._token and eng.pushed_version == version:
            return
        t0 = time.time()
        eng.run(push_weights, eng.llm, actor_weights(model))
        eng.pushed_by, eng.pushed_version = self._token, version
        self.last_sync_s = time.time() - t0
        self.syncs += 1

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        from vllm.inputs import TokensPrompt

        if not prompts:
            return []
        check_prompts(prompts, self.max_model_len)
        self.claim_engine()
        # Seeds from torch's global RNG: the trainer seeds it per step, so rollouts replay.
        seeds = torch.randint(0, MAX_SEED, (len(prompts),)).tolist()
        requests = [
            sampling_request(params, len(p), s, self.max_model_len, self.eos_ids)
            for p, s in zip(prompts, seeds, strict=True)
        ]
        llm = self.llm
        outs = self._engine.run(
            llm.generate,
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
            requests,
            use_tqdm=False,
        )
        result: list[Completion] = []
        for i, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
            result.extend(completions(i, prompt, out, params, self.eos_ids))
        return result

    def close(self) -> None:
        """Release the engine; the last generator on it shuts it down and frees its memory."""
        eng, self._engine = self._engine, None
        if eng is None:
            return
        eng.users -= 1
        if eng.users <= 0:
            _shutdown(eng)


def check_prompts(prompts: list[list[int]], max_len: int) -> None:
    """Refuse a prompt the engine cannot extend, naming the key to change."""
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt {i} is empty")
        if len(p) >= max_len:
            raise ValueError(
                f"prompt {i} has {len(p)} tokens, leaving no room to generate within "
                f"actor_rollout_ref.rollout.max_model_len={max_len} (0 = "
                "data.max_prompt_length + data.max_response_length): raise it or shorten "
                "the prompt"
            )


def sampling_request(
    params: SamplingParams, prompt_len: int, seed: int, max_len: int, eos_ids: list[int]
) -> Any:
    """vLLM's ``SamplingParams`` for one prompt under ``params``."""
    from vllm import SamplingParams as VSamplingParams

    sample = params.do_sample
    return VSamplingParams(
        n=params.n if sample else 1,  # vLLM refuses n>1 when greedy: sampled once, repeated
        temperature=params.temperature if sample else 0.0,
        top_p=params.top_p if sample else 1.0,
        top_k=params.top_k if sample and params.top_k > 0 else 0,
        # vLLM would stop at max_model_len anyway; say so instead of relying on it.
        max_tokens=min(params.max_new_tokens, max_len - prompt_len),
        stop_token_ids=list(eos_ids),
        stop=list(params.stop) or None,
        include_stop_str_in_output=True,
        logprobs=0,  # the sampled token's only
        seed=seed,
        detokenize=bool(params.stop),  # stop strings are matched on text; else ids are all we use
    )


def completions(
    index: int, prompt: list[int], out: Any, params: SamplingParams, eos_ids: list[int]
) -> list[Completion]:
    """The ``params.n`` completions of one ``RequestOutput``, in sample order."""
    copies = params.n if not params.do_sample else 1
    samples = sorted(out.outputs, key=lambda o: o.index)
    if len(samples) * copies != params.n:
        raise RuntimeError(f"vLLM returned {len(samples)} samples for n={params.n}")
    result = []
    for o in samples:
        result.extend(_completion(index, prompt, o, eos_ids) for _ in range(copies))
    return result


def _completion(index: int, prompt: list[int], out: Any, eos_ids: list[int]) -> Completion:
    tokens = list(out.token_ids)
    if out.logprobs is None or len(out.logprobs) != len(tokens):
        raise RuntimeError("vLLM returned no log-prob for some sampled token")
    lps = [float(pos[t].logprob) for pos, t in zip(out.logprobs, tokens, strict=True)]
    if out.finish_reason == "stop":
        if isinstance(out.stop_reason, str):  # a stop string; its last token is kept
            return Completion(index, list(prompt), tokens, lps, "stop")
        if not tokens or tokens[-1] not in eos_ids:
            raise RuntimeError(f"vLLM stopped without a stop token: {tokens[-3:]}")
        return Completion(index, list(prompt), tokens, lps, "stop")
    if out.finish_reason != "length":
        raise RuntimeError(f"vLLM finished a request with {out.finish_reason!r}")
    return Completion(index, list(prompt), tokens, lps, "length")
