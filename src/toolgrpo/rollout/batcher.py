"""Batches generation requests from concurrent episodes into one backend call.

Episodes are asyncio tasks; each awaits ``generate`` for its next turn. While the backend runs
(in its own thread), new requests queue up; when it is free, everything queued goes out as one
call. An episode waiting on a slow tool therefore never holds the others back: it joins whichever
batch is next when its results arrive.

A generator with its own scheduler (``agenerate``: vLLM's async engine) gets each request as it
comes instead; the engine adds it to the batch it is running at its next step.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from toolgrpo.rollout.generator import Completion, GenerationError, Generator, SamplingParams


@dataclass
class _Request:
    prompt_ids: list[int]
    max_new_tokens: int
    future: asyncio.Future[Completion]


class GenerationBatcher:
    def __init__(self, generator: Generator, params: SamplingParams, max_batch: int = 64) -> None:
        self.generator = generator
        self.params = replace(params, n=1)
        self.max_batch = max(1, max_batch)
        self._pending: list[_Request] = []
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolgrpo-gen")
        self.calls = 0  # backend calls made (metrics)
        self.requests = 0

    async def generate(self, prompt_ids: list[int], max_new_tokens: int) -> Completion:
        """One completion of ``prompt_ids`` with at most ``max_new_tokens`` new tokens; a
        backend failure raises ``GenerationError``."""
        agenerate = getattr(self.generator, "agenerate", None)
        if agenerate is not None:
            self.calls += 1
            self.requests += 1
            params = replace(self.params, max_new_tokens=max(1, max_new_tokens))
            try:
                (comp,) = await agenerate(list(prompt_ids), params)
            except Exception as exc:
                raise _backend_error(exc) from exc
            return comp
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done():
            self._wakeup = asyncio.Event()
            self._worker = loop.create_task(self._run())
        req = _Request(list(prompt_ids), max(1, max_new_tokens), loop.create_future())
        self._pending.append(req)
        assert self._wakeup is not None
        self._wakeup.set()
        return await req.future

    async def _run(self) -> None:
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            # Let every episode that is ready in this loop iteration queue its request.
            for _ in range(3):
                await asyncio.sleep(0)
            while self._pending:
                batch, self._pending = (
                    self._pending[: self.max_batch],
                    self._pending[self.max_batch :],
                )
                try:
                    comps = await asyncio.get_running_loop().run_in_executor(
                        self._pool, self._call, batch
                    )
                except Exception as exc:  # a backend failure fails its requests, not the loop
                    err = _backend_error(exc)
                    for r in batch:
                        if not r.future.done():
                            r.future.set_exception(err)
                    continue
                for r, c in zip(batch, comps, strict=True):
                    if not r.future.done():
                        r.future.set_result(c)

    def _call(self, batch: list[_Request]) -> list[Completion]:
        """One backend call; identical prompts (a task's G opening turns) are sampled as n>1 so
        the backend prefills them once."""
        self.calls += 1
        self.requests += len(batch)
        max_new = max(r.max_new_tokens for r in batch)
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, r in enumerate(batch):
            groups.setdefault(tuple(r.prompt_ids), []).append(i)
        sizes = {len(g) for g in groups.values()}
        out: list[Completion | None] = [None] * len(batch)
        if len(sizes) == 1 and (n := sizes.pop()) > 1:
            keys = list(groups)
            comps = self.generator.generate(
                [list(k) for k in keys], replace(self.params, n=n, max_new_tokens=max_new)
            )
            for c in comps:
                idx = groups[keys[c.prompt_index]].pop(0)
                out[idx] = c
        else:
            comps = self.generator.generate(
                [r.prompt_ids for r in batch], replace(self.params, max_new_tokens=max_new)
            )
            for c in comps:
                out[c.prompt_index] = c
        return [_clip(c, r.max_new_tokens) for c, r in zip(out, batch, strict=True)]  # type: ignore[arg-type]

    def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
        self._pool.shutdown(wait=False)


def _backend_error(exc: Exception) -> GenerationError:
    if isinstance(exc, GenerationError):
        return exc
    err = GenerationError(f"the generation backend failed: {type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err


def _clip(c: Completion, max_new: int) -> Completion:
    """Sampling is autoregressive, so cutting a longer sample equals sampling with a lower cap."""
    if len(c.token_ids) <= max_new:
        return c
    return replace(
        c, token_ids=c.token_ids[:max_new], logprobs=c.logprobs[:max_new], finish_reason="length"
    )
