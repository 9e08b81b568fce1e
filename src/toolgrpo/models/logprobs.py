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


@dataclass
class ResponseLogprobs:
    logprobs_BR: torch.Tensor  # float32
    entropy_BR: torch.Tensor | None = None
    hidden_BR: torch.Tensor | None = None  # final hidden state at the position predicting each token


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, matching what ``generate`` used for the same rows."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


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


def response_logprobs(
    causal_lm: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    temperature: float = 1.0,
    chunk_size: int = 64,
    with_entropy: bool = False,
    with_hidden: bool = False,
) -> ResponseLogprobs:
    """Log-probs (and entropy) of the last ``response_length`` tokens of each row.

    ``causal_lm`` is a ``*ForCausalLM`` (for LoRA, the PEFT base model with adapters in place).
    """
    backbone = causal_lm.get_decoder()
    head = causal_lm.get_output_embeddings()
    out = backbone(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    )
    hidden = out.last_hidden_state[:, -response_length - 1 : -1]
    targets = input_ids[:, -response_length:]
    lps, ents = [], []
    grad = torch.is_grad_enabled()
    for s in range(0, response_length, chunk_size):
        h, t = hidden[:, s : s + chunk_size], targets[:, s : s + chunk_size]
        if grad:
            lp, ent = checkpoint(
                _chunk_stats, head, h, t, temperature, with_entropy, use_reentrant=False
            )
        else:
            lp, ent = _chunk_stats(head, h, t, temperature, with_entropy)
        lps.append(lp)
        ents.append(ent)
    return ResponseLogprobs(
        logprobs_BR=torch.cat(lps, dim=1),
        entropy_BR=torch.cat(ents, dim=1) if with_entropy else None,
        hidden_BR=hidden if with_hidden else None,
    )
