"""The support gap: the actor's probability mass on tokens the fixed sampler can never draw.

A fixed policy sampled with top-k/top-p has zero probability outside its kept tokens, so no
importance weight can account for the actor's mass there: the estimator then follows the
gradient of the objective restricted to the fixed sampler's support (``tests/mixture/
test_bias.py`` shows it exactly). ``actor/is_support_gap`` is the mean over fixed rows' response
tokens of Σ_{v ∉ S_t} π(v | y_<t), with S_t the fixed sampler's support at that position.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import LogitsProcessorList, TopKLogitsWarper, TopPLogitsWarper

from toolgrpo.models.logprobs import _last_hidden
from toolgrpo.rollout.generator import SamplingParams


def support_mask(logits_NV: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Tokens the sampler can draw, by HF's own warpers (as the HF backend samples)."""
    procs = LogitsProcessorList()
    if params.top_k > 0:
        procs.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        procs.append(TopPLogitsWarper(params.top_p))
    scores = logits_NV.float() / params.temperature
    if len(procs):
        dummy = torch.zeros((scores.shape[0], 1), dtype=torch.long)
        scores = procs(dummy, scores)
    return torch.isfinite(scores)


def _hidden(policy: Any, ids: torch.Tensor, attn: torch.Tensor, r: int) -> torch.Tensor:
    with policy.autocast():
        return _last_hidden(policy.base, ids, attn)[:, -r - 1 : -1]


@torch.no_grad()
def support_gap(
    actor: Any,
    actor_temperature: float,
    fixed: Any,
    params: SamplingParams,
    input_ids_BT: torch.Tensor,
    attention_mask_BT: torch.Tensor,
    mask_BR: torch.Tensor,
    rows: int = 2,
    positions: int = 32,
) -> tuple[float, float]:
    """(Σ gap, number of tokens) over the rows given: the actor's mass outside ``fixed``'s
    sampling support, position by position. Chunked so no [B, R, V] tensor is built."""
    r = mask_BR.shape[1]
    total, count = 0.0, 0.0
    head_a, head_f = actor.base.get_output_embeddings(), fixed.base.get_output_embeddings()
    for s in range(0, input_ids_BT.shape[0], rows):
        ids, attn = input_ids_BT[s : s + rows], attention_mask_BT[s : s + rows]
        mask = mask_BR[s : s + rows].bool()
        if not bool(mask.any()):
            continue
        ha, hf = _hidden(actor, ids, attn, r), _hidden(fixed, ids, attn, r)
        for p in range(0, r, positions):
            m = mask[:, p : p + positions]
            if not bool(m.any()):
                continue
            la = head_a(ha[:, p : p + positions][m]).float() / actor_temperature
            lf = head_f(hf[:, p : p + positions][m]).float()
            outside = ~support_mask(lf, params)
            total += float((torch.softmax(la, -1) * outside).sum())
            count += float(m.sum())
    return total, count
