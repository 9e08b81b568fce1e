"""Per-token log-probs of response tokens without materialising full-vocabulary logits.

The peak memory of an RL step on a small model is the ``[B, T, V]`` logits tensor (V = 49,152 for
SmolLM2). We run the transformer once, then apply the LM head only at response positions, in chunks,
recomputing each chunk in backward (activation checkpointing) so only one chunk of logits lives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from toolgrpo.models.compiled import compiled


@dataclass
class ResponseLogprobs:
    logprobs_BR: torch.Tensor  # float32
    entropy_BR: torch.Tensor | None = None
    hidden_BR: torch.Tensor | None = (
        None  # final hidden state at the position predicting each token
    )


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, matching what ``generate`` used for the same rows."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _last_hidden(causal_lm: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """Final hidden states of a padded batch (positions skip left padding, as in generation)."""
    out = causal_lm.get_decoder()(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    )
    return out.last_hidden_state


def _chunk_stats(
    head: torch.nn.Module, h: torch.Tensor, targets: torch.Tensor, temperature: float, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(h).float()
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    lp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not entropy:
        return lp, torch.zeros_like(lp)
    probs = torch.softmax(logits, dim=-1)
    ent = lse - (probs * logits).sum(-1)
    return lp, ent


def _head_stats(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    chunk_size: int,
    with_entropy: bool,
    with_hidden: bool,
    target_mask: torch.Tensor | None = None,
    compile_head: bool = False,
) -> ResponseLogprobs:
    """LM head over ``hidden [B, R, H]`` in chunks along R, each recomputed in backward.

    With ``target_mask [B, R]`` the head runs only where it is 1 (the policy's own tokens); the
    other positions get 0. In multi-turn episodes most response tokens are tool output that no
    loss reads, and the head (49k-way for SmolLM2) is a large share of a token's cost."""
    if target_mask is not None:
        keep = target_mask.bool()
        picked = _head_stats(
            head,
            hidden[keep][None],
            targets[keep][None],
            temperature,
            chunk_size,
            with_entropy,
            False,
            compile_head=compile_head,
        )
        zeros = torch.zeros(targets.shape, dtype=picked.logprobs_BR.dtype, device=targets.device)
        ent = picked.entropy_BR
        return ResponseLogprobs(
            logprobs_BR=zeros.masked_scatter(keep, picked.logprobs_BR[0]),
            entropy_BR=None if ent is None else zeros.masked_scatter(keep, ent[0]),
            hidden_BR=hidden if with_hidden else None,
        )
    lps, ents = [], []
    grad = torch.is_grad_enabled()
    stats = compiled(_chunk_stats) if compile_head else _chunk_stats
    for s in range(0, targets.shape[1], chunk_size):
        h, t = hidden[:, s : s + chunk_size], targets[:, s : s + chunk_size]
        if grad:
            lp, ent = checkpoint(stats, head, h, t, temperature, with_entropy, use_reentrant=False)
        else:
            lp, ent = stats(head, h, t, temperature, with_entropy)
        lps.append(lp)
        ents.append(ent)
    if not lps:  # no position to score: empty, but still part of the graph for backward
        empty = hidden.float().sum(-1)
        return ResponseLogprobs(empty, empty if with_entropy else None, None)
    return ResponseLogprobs(
        logprobs_BR=torch.cat(lps, dim=1),
        entropy_BR=torch.cat(ents, dim=1) if with_entropy else None,
        hidden_BR=hidden if with_hidden else None,
    )


def response_logprobs(
    causal_lm: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    temperature: float = 1.0,
    chunk_size: int = 64,
    with_entropy: bool = False,
    with_hidden: bool = False,
    target_mask: torch.Tensor | None = None,
    compile_head: bool = False,
) -> ResponseLogprobs:
    """Log-probs (and entropy) of the last ``response_length`` tokens of each row; with
    ``target_mask [B, response_length]`` only where it is 1 (0 elsewhere).

    ``causal_lm`` is a ``*ForCausalLM`` (for LoRA, the PEFT base model with adapters in place).
    """
    head = causal_lm.get_output_embeddings()
    last = _last_hidden(causal_lm, input_ids, attention_mask)
    hidden = last[:, -response_length - 1 : -1]
    targets = input_ids[:, -response_length:]
    return _head_stats(
        head,
        hidden,
        targets,
        temperature,
        chunk_size,
        with_entropy,
        with_hidden,
        target_mask,
        compile_head,
    )


def length_buckets(lengths: list[int], slack: float = 1.25) -> list[list[int]]:
    """Rows grouped so that padding each group to its longest row wastes little: rows sorted by
    length (longest first) join a group while ``size × longest ≤ slack × real tokens``.

    A multi-turn group often holds one long episode beside short ones (640 vs 60 tokens); padding
    all of them to the longest made the update run several times the tokens it trains on."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    buckets: list[list[int]] = []
    real = 0
    for i in order:
        if buckets:
            rows = buckets[-1]
            longest = max(lengths[rows[0]], 1)
            if (len(rows) + 1) * longest <= slack * (real + max(lengths[i], 1)):
                rows.append(i)
                real += max(lengths[i], 1)
                continue
        buckets.append([i])
        real = max(lengths[i], 1)
    return buckets


def _prompt_cache(causal_lm: Any, prompt_cache: Any, rows: int) -> Any:
    """A fresh cache holding the prompt's keys/values once per row (gradients flow back into the
    prompt's single pass)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=causal_lm.config)
    for i, layer in enumerate(prompt_cache.layers):
        cache.update(layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1), i)
    return cache


def shared_prefix_logprobs(
    causal_lm: Any,
    prompt_ids: torch.Tensor,
    response_ids: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 64,
    with_entropy: bool = False,
    with_hidden: bool = False,
    response_lengths: list[int] | None = None,
    target_mask: torch.Tensor | None = None,
    compile_head: bool = False,
) -> ResponseLogprobs:
    """Like ``response_logprobs`` for n responses ``[n, R]`` that share one prompt ``[P]``: the
    prompt runs once and its KV cache (gradient included) is shared, so a group costs
    ``P + n·R`` tokens instead of ``n·(P + R)`` — the prompt dominates RLLA-sized inputs.

    With ``response_lengths`` (tokens up to each row's last real one) the responses run in
    ``length_buckets``, each padded only to its own longest row: about ``P + Σ R_i`` tokens.
    Right padding in ``response_ids`` is harmless: causal attention never lets a real token see a
    later pad, and pad positions are masked out of every loss (their outputs here are zeros).
    ``target_mask [n, R]`` limits the LM head to the positions where it is 1, as in
    ``response_logprobs``. ``compile_head``: the head's per-chunk statistics torch.compiled
    (``toolgrpo.models.compiled``).
    """
    from transformers import DynamicCache

    backbone = causal_lm.get_decoder()
    head = causal_lm.get_output_embeddings()
    n, r = response_ids.shape
    p = prompt_ids.shape[0]
    lengths = [r] * n if response_lengths is None else [min(max(x, 1), r) for x in response_lengths]
    cache = DynamicCache(config=causal_lm.config)
    first = backbone(input_ids=prompt_ids.view(1, p), past_key_values=cache, use_cache=True)
    h_last = first.last_hidden_state[:, -1:]  # predicts response token 0
    parts: list[tuple[list[int], ResponseLogprobs]] = []
    for rows in length_buckets(lengths):
        w = max(lengths[i] for i in rows)
        ids = response_ids[rows, :w]
        hidden = h_last.expand(len(rows), 1, -1)
        if w > 1:
            rest = backbone(
                input_ids=ids[:, :-1],
                past_key_values=_prompt_cache(causal_lm, cache, len(rows)),
                position_ids=torch.arange(p, p + w - 1, device=ids.device).expand(len(rows), -1),
                use_cache=True,
            )
            hidden = torch.cat([hidden, rest.last_hidden_state], dim=1)
        mask = None if target_mask is None else target_mask[rows, :w]
        stats = _head_stats(
            head,
            hidden,
            ids,
            temperature,
            chunk_size,
            with_entropy,
            with_hidden,
            mask,
            compile_head,
        )
        parts.append((rows, stats))
    return _scatter_rows(parts, n, r)


def _scatter_rows(parts: list[tuple[list[int], ResponseLogprobs]], n: int, r: int):
    """Bucketed results back in row order, right-padded with zeros to width ``r``."""
    order = [i for rows, _ in parts for i in rows]
    inverse = torch.empty(n, dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(n)

    def cat(field: str) -> torch.Tensor | None:
        ts = [getattr(s, field) for _, s in parts]
        if ts[0] is None:
            return None
        padded = [
            torch.nn.functional.pad(
                t, (0, 0, 0, r - t.shape[1]) if t.dim() == 3 else (0, r - t.shape[1])
            )
            for t in ts
        ]
        return torch.cat(padded, dim=0)[inverse]

    return ResponseLogprobs(
        logprobs_BR=cat("logprobs_BR"), entropy_BR=cat("entropy_BR"), hidden_BR=cat("hidden_BR")
    )


def masked_token_logprobs(
    causal_lm: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    target_mask: torch.Tensor,
    chunk_size: int = 256,
) -> torch.Tensor:
    """Log-probs of the tokens where ``target_mask`` is 1 (flattened, row-major), computing the
    LM head only at those positions: SFT's loss on assistant tokens without [B, T, V] logits."""
    head = causal_lm.get_output_embeddings()
    last = _last_hidden(causal_lm, input_ids, attention_mask)
    select = target_mask[:, 1:].bool()
    hidden = last[:, :-1][select]  # [N, H]: positions predicting a target
    targets = input_ids[:, 1:][select]
    lps = []
    for s in range(0, hidden.shape[0], chunk_size):
        h, t = hidden[None, s : s + chunk_size], targets[None, s : s + chunk_size]
        if torch.is_grad_enabled():
            lp, _ = checkpoint(_chunk_stats, head, h, t, 1.0, False, use_reentrant=False)
        else:
            lp, _ = _chunk_stats(head, h, t, 1.0, False)
        lps.append(lp[0])
    return torch.cat(lps) if lps else hidden.new_zeros(0)
