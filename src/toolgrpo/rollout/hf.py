"""Hugging Face ``generate`` backend: batched sampling that records the sampled tokens' log-probs.

We install the temperature/top-k/top-p warpers ourselves, followed by a recorder, so the recorded
log-probs are exactly those of the distribution each token was drawn from (truncation included) —
what an importance-sampling denominator needs — and only one ``[B, V]`` row set is kept at a time.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from toolgrpo.rollout.generator import Completion, SamplingParams

log = logging.getLogger(__name__)

# Warpers HF's generate() installs *after* custom logits processors (so after our recorder) when
# a model's generation_config.json sets them: the tokens would be drawn from a distribution the
# recorded log-probs do not describe. Sampling here is what the config says (temperature, top_k,
# top_p), as on vLLM, so they are switched off for our calls; "neutral" = the value that is off.
_AFTER_RECORDER = {
    "min_p": None,
    "typical_p": None,
    "epsilon_cutoff": None,
    "eta_cutoff": None,
    "top_h": None,
    "watermarking_config": None,
}
_warned: set[tuple[str, Any]] = set()


@contextmanager
def neutral_generation_config(model: Any) -> Iterator[None]:
    """Hide the sampling warpers a model's ``generation_config`` would add after our recorder
    (see ``_AFTER_RECORDER``) for the duration of a ``generate`` call; warns once per value."""
    gc = getattr(model, "generation_config", None)
    found = {k: getattr(gc, k, None) for k in _AFTER_RECORDER} if gc is not None else {}
    found = {k: v for k, v in found.items() if v is not None}
    if not found:
        yield
        return
    for item in found.items():
        key = (item[0], repr(item[1]))
        if key not in _warned:
            _warned.add(key)
            log.warning(
                "the model's generation_config sets %s=%r: ignored when sampling rollouts "
                "(only temperature, top_k and top_p apply, and recorded log-probs match them)",
                *item,
            )
    neutral = copy.deepcopy(gc)
    for k in found:
        setattr(neutral, k, _AFTER_RECORDER[k])
    model.generation_config = neutral
    try:
        yield
    finally:
        model.generation_config = gc


class _LogprobRecorder(LogitsProcessor):
    """Keeps log_softmax of the final scores for one step, gathering the previous step's token."""

    def __init__(self) -> None:
        self.pending: torch.Tensor | None = None
        self.taken: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.collect(input_ids[:, -1])
        self.pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def collect(self, last_tokens: torch.Tensor) -> None:
        if self.pending is not None:
            self.taken.append(self.pending.gather(-1, last_tokens.view(-1, 1)).squeeze(-1))
            self.pending = None


def stop_token_ids(tokenizer: Any) -> list[int]:
    """EOS ids that end a turn: the tokenizer's EOS plus ChatML's <|im_end|> / <|endoftext|>,
    Llama 3's <|eot_id|> and <|eom_id|> (the end of a turn that called a tool and waits for
    its result), and Gemma's <end_of_turn> (its GGUF tokenizer's EOS is <eos>)."""
    ids = {tokenizer.eos_token_id}
    for t in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>"):
        tid = tokenizer.convert_tokens_to_ids(t)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return sorted(i for i in ids if i is not None)


class HFGenerator:
    """Generation from an in-process model that shares weights with the trainer (no sync needed)."""

    def __init__(self, model: Any, tokenizer: Any, dtype: torch.dtype, batch_size: int = 16):
        self.model = model
        self.tokenizer = tokenizer
        self.dtype = dtype
        self.batch_size = batch_size
        self.eos_ids = stop_token_ids(tokenizer)
        self.pad_id = tokenizer.pad_token_id

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        per_call = max(1, self.batch_size // params.n)  # prompts per generate() call
        out: list[Completion] = []
        for s in range(0, len(prompts), per_call):
            chunk = list(enumerate(prompts[s : s + per_call], start=s))
            out.extend(self._generate_batch(chunk, params))
        return out

    def _prefill(self, ids: torch.Tensor, mask: torch.Tensor, n: int) -> Any:
        """Run each distinct prompt once (all but its last token) and share the KV cache among
        its n samples: for ~800-token tool prompts, prefill otherwise costs n times over."""
        from transformers import DynamicCache

        if ids.shape[1] < 2:
            return None
        cache = DynamicCache(config=self.model.config)
        m = mask[:, :-1]
        self.model(
            input_ids=ids[:, :-1],
            attention_mask=m,
            position_ids=(m.cumsum(-1) - 1).clamp(min=0),
            past_key_values=cache,
            use_cache=True,
        )
        if n > 1:
            cache.batch_repeat_interleave(n)
        return cache

    @torch.no_grad()
    def _generate_batch(self, prompts: list[tuple[int, list[int]]], params: SamplingParams):
        width = max(len(p) for _, p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for r, (_, p) in enumerate(prompts):
            ids[r, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[r, width - len(p) :] = 1
        rows = [row for row in prompts for _ in range(params.n)]
        recorder = _LogprobRecorder()
        processors: list[LogitsProcessor] = []
        if params.do_sample:
            if params.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k > 0:
                processors.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1.0:
                processors.append(TopPLogitsWarper(params.top_p))
        processors.append(recorder)
        # Our warpers above do all the shaping; neutral values keep HF from adding its own.
        neutral = {"temperature": 1.0, "top_k": 0, "top_p": 1.0} if params.do_sample else {}
        gen_cfg = GenerationConfig(
            do_sample=params.do_sample,
            **neutral,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            stop_strings=list(params.stop) or None,
        )
        # HF matches stop strings on tokens and needs the tokenizer for it.
        with_tokenizer = {"tokenizer": self.tokenizer} if params.stop else {}
        was_training = self.model.training
        self.model.eval()
        try:
            enabled = self.dtype != torch.float32
            device = next(self.model.parameters()).device  # trainer.device (or CPU)
            ids, mask = ids.to(device), mask.to(device)
            with (
                torch.autocast(device.type, dtype=self.dtype, enabled=enabled),
                neutral_generation_config(self.model),
            ):
                cache = self._prefill(ids, mask, params.n)
                seqs = self.model.generate(
                    input_ids=ids.repeat_interleave(params.n, dim=0),
                    attention_mask=mask.repeat_interleave(params.n, dim=0),
                    past_key_values=cache,
                    generation_config=gen_cfg,
                    logits_processor=LogitsProcessorList(processors),
                    **with_tokenizer,
                )
        finally:
            self.model.train(was_training)
        new = seqs[:, width:]
        if new.shape[1] > 0:
            recorder.collect(new[:, -1])
        lp = torch.stack(recorder.taken, dim=1) if recorder.taken else torch.zeros(len(rows), 0)
        return [self._completion(i, p, new[r], lp[r], params) for r, (i, p) in enumerate(rows)]

    def _completion(self, index, prompt, new_ids, lps, params) -> Completion:
        tokens = new_ids.tolist()
        end = next((k for k, t in enumerate(tokens) if t in self.eos_ids), None)
        if params.stop:  # a stopped row is padded after its stop string: cut there
            before_eos = tokens if end is None else tokens[:end]
            hit = stop_string_end(self.tokenizer, before_eos, params.stop)
            end = hit if hit is not None else end
        if end is None:
            return Completion(index, list(prompt), tokens, lps.tolist(), "length")
        return Completion(index, list(prompt), tokens[: end + 1], lps[: end + 1].tolist(), "stop")


def stop_string_end(tokenizer: Any, tokens: list[int], stops: tuple[str, ...]) -> int | None:
    """Index of the token whose decoding completes the first occurrence of a stop string."""
    text = tokenizer.decode(tokens, skip_special_tokens=False)
    if not any(s in text for s in stops):
        return None
    lo, hi = 0, len(tokens) - 1  # the shortest prefix whose text contains a stop string
    while lo < hi:
        mid = (lo + hi) // 2
        prefix = tokenizer.decode(tokens[: mid + 1], skip_special_tokens=False)
        if any(s in prefix for s in stops):
            hi = mid
        else:
            lo = mid + 1
    return lo
