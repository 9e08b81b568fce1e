"""Exact expected gradients of the fixed-row estimators, by enumerating every response.

On a tiny causal LM with a small vocabulary and fixed-length responses (1–3 tokens), every
response y can be listed, so the expectation of an estimator over the fixed policy's samples is
a finite sum, E_{y~π_fixed}[∇L(y)] = Σ_y π_fixed(y)·∇L(y), and the on-policy gradient is
∇Σ_y π(y)·A(y). No sampling noise: a bias shows as a number, not a z-score. The loss of each
row is the production one (``correct_fixed_rows`` then ``ppo_policy_loss``), evaluated at the
start of an update (θ = θ_old), where PPO's gradient is the policy gradient.

Used by ``tests/mixture/test_bias.py`` and ``benchmarks/mixture_bias.py`` (the docs' table).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from toolgrpo.algos.losses import ppo_policy_loss
from toolgrpo.mixture.correction import correct_fixed_rows


@dataclass(frozen=True)
class Estimator:
    """One way of training on fixed rows (the config that selects it in ``name``)."""

    name: str
    bypass_mode: bool = False
    level: str = "sequence"
    threshold: float | None = 2.0
    weighted: bool = True  # False: fixed rows treated as the actor's own (no correction)


ESTIMATORS = (
    Estimator("default: decoupled, rollout_is=sequence, C=2"),
    Estimator("decoupled, rollout_is=sequence, C=null", threshold=None),
    Estimator("decoupled, rollout_is=token, C=2", level="token"),
    Estimator("decoupled, rollout_is=token, C=null", level="token", threshold=None),
    Estimator("bypass_mode=true (design's literal method)", bypass_mode=True),
    Estimator("no correction (fixed rows as on-policy)", weighted=False),
)


def tiny_lm(vocab: int = 4, seed: int = 0, sharpness: float = 4.0) -> LlamaForCausalLM:
    """A float64 one-layer Llama over ``vocab`` tokens; ``sharpness`` scales the final norm so
    the next-token distributions are far from uniform (random init is nearly flat)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=16,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).double()
    with torch.no_grad():
        model.model.norm.weight.mul_(sharpness)
    return model


def all_responses(vocab: int, length: int) -> torch.Tensor:
    """Every response of ``length`` tokens, ``[vocab**length, length]``."""
    return torch.tensor(list(itertools.product(range(vocab), repeat=length)), dtype=torch.long)


def sampler_logprobs(
    model: LlamaForCausalLM,
    prompt: list[int],
    responses: torch.Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> torch.Tensor:
    """Per-token log-probs ``[N, L]`` of each response under ``model`` sampled with these
    settings (HF's own warpers: -inf outside the top-k/top-p support)."""
    n, length = responses.shape
    ids = torch.cat([torch.tensor(prompt).expand(n, -1), responses], dim=1)
    logits = model(input_ids=ids).logits[:, len(prompt) - 1 : -1]  # [N, L, V]
    procs = LogitsProcessorList()
    if temperature != 1.0:
        procs.append(TemperatureLogitsWarper(temperature))
    if top_k > 0:
        procs.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p))
    flat = logits.reshape(n * length, -1)
    if len(procs):
        flat = procs(ids[:, :1].repeat_interleave(length, 0), flat)
    lp = torch.log_softmax(flat, -1).reshape(n, length, -1)
    return lp.gather(-1, responses.unsqueeze(-1)).squeeze(-1)


def _flat_grad(model: torch.nn.Module, loss: torch.Tensor) -> torch.Tensor:
    model.zero_grad()
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@dataclass
class ExactResult:
    on_policy: torch.Tensor  # gradient of -E_π[A]
    estimates: dict[str, torch.Tensor]  # name -> gradient of E_{π_fixed}[loss]
    seq_ess: float  # (E_q w)² / E_q w² of the untruncated sequence weights

    def relative_error(self, name: str) -> float:
        g = self.estimates[name]
        return float((g - self.on_policy).norm() / self.on_policy.norm())


def exact_gradients(
    actor: LlamaForCausalLM,
    fixed: LlamaForCausalLM,
    prompt: list[int],
    length: int,
    rewards: torch.Tensor,
    fixed_temperature: float = 0.8,
    fixed_top_k: int = 0,
    fixed_top_p: float = 1.0,
    estimators: tuple[Estimator, ...] = ESTIMATORS,
    clip: tuple[float, float, float] = (0.2, 0.2, 3.0),
) -> ExactResult:
    """Each estimator's expected gradient over π_fixed's responses and the on-policy one.

    ``rewards[y]`` per enumerated response; the advantage is A = r − E_π[r] (a constant
    baseline, so the on-policy gradient is unchanged by it). Rows are weighted by π_fixed(y)
    through the (positive, detached) advantage scale, which the PPO loss is linear in."""
    vocab = actor.config.vocab_size
    ys = all_responses(vocab, length)
    mask = torch.ones(ys.shape, dtype=torch.float64)
    lp = sampler_logprobs(actor, prompt, ys)  # the actor's policy, with grad
    with torch.no_grad():
        q_tok = sampler_logprobs(fixed, prompt, ys, fixed_temperature, fixed_top_k, fixed_top_p)
    pi = lp.sum(-1).exp()
    adv = (rewards - (pi.detach() * rewards).sum()).double()
    on_policy = _flat_grad(actor, -(pi * adv).sum())
    q = q_tok.sum(-1).exp()  # 0 outside the fixed sampler's support
    keep = q > 0
    q_k, adv_k = q_tok[keep], adv[keep]
    log_w = (lp.detach()[keep] - q_k).sum(-1)
    w = log_w.exp()
    seq_ess = float((q[keep] * w).sum() ** 2 / (q[keep] * w * w).sum())
    out: dict[str, torch.Tensor] = {}
    n = int(keep.sum())
    for est in estimators:
        lp_k = sampler_logprobs(actor, prompt, ys[keep])
        cur = lp_k.detach()
        if est.weighted:
            fixed_B = torch.ones(n, dtype=torch.bool)
            c = correct_fixed_rows(
                cur, q_k, cur, mask[keep], fixed_B, est.bypass_mode, est.level, est.threshold
            )
            old, weights = c.old_logprobs_BR, c.is_weights_BR
        else:
            old, weights = cur, None
        scale = (q[keep] * n).unsqueeze(-1)  # Σ_y q(y)·L(y) through seq-mean-token-sum
        loss, _ = ppo_policy_loss(
            old,
            lp_k,
            adv_k.unsqueeze(-1).expand_as(lp_k) * scale,
            mask[keep],
            clip[0],
            clip[1],
            clip[2],
            "seq-mean-token-sum",
            is_weights_BT=weights,
        )
        out[est.name] = _flat_grad(actor, loss)
    return ExactResult(on_policy, out, seq_ess)


def scenario(
    seed: int,
    length: int,
    vocab: int = 4,
    fixed_temperature: float = 0.8,
    fixed_top_k: int = 0,
    estimators: tuple[Estimator, ...] = ESTIMATORS,
) -> ExactResult:
    """A seeded actor, a different fixed model, a 2-token prompt and uniform random rewards."""
    actor = tiny_lm(vocab, seed=2 * seed)
    fixed = tiny_lm(vocab, seed=2 * seed + 1)
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.rand(vocab**length, generator=gen, dtype=torch.float64)
    return exact_gradients(
        actor, fixed, [0, 1], length, rewards, fixed_temperature, fixed_top_k, 1.0, estimators
    )
