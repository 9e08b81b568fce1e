"""The generation contract every backend fulfils: token ids in, sampled ids + log-probs out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0 = off
    max_new_tokens: int = 128
    do_sample: bool = True
    # Strings that end a completion once its decoded text contains one (vLLM's ``stop``); the
    # token that completes it is kept, like a sampled stop token.
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.do_sample and self.temperature <= 0:
            raise ValueError("temperature must be > 0 when sampling (use do_sample=False)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {self.stop!r}")

    @property
    def truncated(self) -> bool:
        """Whether sampling truncates the distribution (top-k/top-p), so its log-probs differ
        from the plain temperature-scaled softmax a trainer computes."""
        return self.do_sample and (self.top_p < 1.0 or self.top_k > 0)


@dataclass
class Completion:
    """One sampled continuation; ``logprobs`` are under the distribution it was drawn from."""

    prompt_index: int
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    # "stop": a stop token was sampled or a stop string completed (either is included) | "length"
    finish_reason: str


class GenerationError(RuntimeError):
    """The generation backend failed (an engine died, a request was refused): this stops the
    step instead of being scored as episodes' environment errors."""


class Generator(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """``params.n`` completions per prompt, grouped by prompt in prompt order."""
        ...
