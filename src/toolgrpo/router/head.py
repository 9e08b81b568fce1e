"""The router head: route logits from a prompt representation taken from the actor's LM.

The representation is the final hidden state of the prompt's last token (``last``: with left
padding it has attended to the whole prompt) or the mean over the prompt's tokens (``mean``).
The head normalises it and maps it to one logit per route; zero-initialised, so a fresh head is
uniform over routes rather than arbitrarily confident.

Normalisation (``router.feature_norm``): ``standardize`` (default) subtracts a running mean of the
features and divides by their running std per dimension, taken over the prompts routed so far
(the last ``FEATURE_WINDOW`` or so, as the LM drifts); ``layer`` normalises each vector on its
own (LayerNorm without affine). An LM's prompt states share one dominant direction (on SmolLM2
its squared norm is ~50× the spread between task types), which ``layer`` keeps: every SGD step
then mostly moves a common bias, and the head routes every task type alike. Subtracting the
mean leaves what differs between prompts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from toolgrpo.models.logprobs import position_ids_from_mask

POOLINGS = ("last", "mean")
FEATURE_NORMS = ("standardize", "layer")
FEATURE_WINDOW = 1024  # prompts: the running statistics' effective memory


@dataclass
class RouterOutput:
    """What a router forward gives (shapes: B prompts, K routes)."""

    router_logits: torch.Tensor  # [B, K]
    router_action: torch.Tensor  # [B] route index, sampled or argmax
    router_log_prob: torch.Tensor  # [B] log π(action | prompt)

    @property
    def probs(self) -> torch.Tensor:
        return torch.softmax(self.router_logits.float(), dim=-1)


class RouterHead(torch.nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_routes: int = 3,
        mlp_hidden: int = 0,
        feature_norm: str = "standardize",
    ) -> None:
        super().__init__()
        if feature_norm not in FEATURE_NORMS:
            raise ValueError(
                f"unknown router feature_norm {feature_norm!r}; known: {', '.join(FEATURE_NORMS)}"
            )
        self.hidden_size, self.num_routes, self.mlp_hidden = hidden_size, num_routes, mlp_hidden
        self.feature_norm = feature_norm
        if feature_norm == "layer":
            self.norm = torch.nn.LayerNorm(hidden_size, elementwise_affine=False)
        else:  # running statistics, saved with the weights (router.pt)
            self.register_buffer("feature_mean", torch.zeros(hidden_size))
            self.register_buffer("feature_var", torch.ones(hidden_size))
            self.register_buffer("feature_count", torch.zeros(()))
        layers: list[torch.nn.Module] = []
        width = hidden_size
        if mlp_hidden > 0:
            layers += [torch.nn.Linear(hidden_size, mlp_hidden), torch.nn.Tanh()]
            width = mlp_hidden
        out = torch.nn.Linear(width, num_routes)
        torch.nn.init.zeros_(out.weight)
        torch.nn.init.zeros_(out.bias)
        self.net = torch.nn.Sequential(*layers, out)
        # Added to the logits when set: the served head's budget offset (router/offset.py), set
        # by whoever serves it, never while training; not part of the weights.
        self.logit_shift: torch.Tensor | None = None

    @torch.no_grad()
    def observe(self, features_BH: torch.Tensor) -> None:
        """Fold a batch of prompt features into the running mean and variance (``standardize``;
        a no-op for ``layer``). Exact pooled statistics until ``FEATURE_WINDOW`` prompts, then
        an exponential average over about that many."""
        if self.feature_norm != "standardize" or features_BH.shape[0] == 0:
            return
        x = features_BH.detach().float().to(self.feature_mean.device)
        b = x.shape[0]
        n = float(self.feature_count)
        w = b / min(n + b, max(FEATURE_WINDOW, b))
        mean_b = x.mean(0)
        var_b = x.var(0, unbiased=False)
        delta = mean_b - self.feature_mean
        if n == 0:
            self.feature_var.copy_(var_b)
        else:
            self.feature_var.copy_((1 - w) * self.feature_var + w * var_b + w * (1 - w) * delta**2)
        self.feature_mean.add_(w * delta)
        self.feature_count.add_(b)

    def normalize(self, features_BH: torch.Tensor) -> torch.Tensor:
        """The head's input: about unit norm, whatever the LM's width."""
        x = features_BH.float()
        if self.feature_norm == "layer":
            return self.norm(x) / self.hidden_size**0.5
        if float(self.feature_count) < 2:  # no spread observed yet (a fresh head): layer-normed
            return torch.nn.functional.layer_norm(x, (self.hidden_size,)) / self.hidden_size**0.5
        floor = 1e-3 * float(self.feature_var.mean()) + 1e-6  # near-constant dimensions
        z = (x - self.feature_mean) / (self.feature_var + floor).sqrt()
        return z / self.hidden_size**0.5

    def forward(self, features_BH: torch.Tensor) -> torch.Tensor:
        # Unit-norm inputs: a gradient step of size lr moves a prompt's logits by about lr·A.
        logits = self.net(self.normalize(features_BH))
        return logits if self.logit_shift is None else logits + self.logit_shift.to(logits)

    def act(
        self, features_BH: torch.Tensor, sample: bool = True, generator: Any = None
    ) -> RouterOutput:
        """Logits, a sampled (or argmax) route per row, and its log-probability."""
        logits = self(features_BH)
        logp = torch.log_softmax(logits, dim=-1)
        if sample:
            action = torch.multinomial(logp.exp().detach(), 1, generator=generator).squeeze(-1)
        else:
            action = logits.detach().argmax(-1)
        return RouterOutput(logits, action, logp.gather(-1, action.view(-1, 1)).squeeze(-1))


class HeadAverage:
    """A bias-corrected exponential average of a head's weights over its updates (``decay`` per
    update; its feature statistics are not averaged). Under a moving price λ the last iterate
    swings with λ; the average is the policy the run played, so held-out cost follows the
    budget (``router.head_ema``)."""

    def __init__(self, head: RouterHead, decay: float) -> None:
        self.decay, self.steps = decay, 0
        self.weights = {k: torch.zeros_like(v) for k, v in head.net.state_dict().items()}

    @torch.no_grad()
    def update(self, head: RouterHead) -> None:
        self.steps += 1
        for k, v in head.net.state_dict().items():
            self.weights[k].mul_(self.decay).add_(v.detach(), alpha=1 - self.decay)

    def averaged(self) -> dict[str, torch.Tensor]:
        scale = 1 - self.decay**self.steps
        return {k: v / scale for k, v in self.weights.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "steps": self.steps, "weights": self.weights}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
        for k, v in state["weights"].items():
            self.weights[k].copy_(v)


def pool(hidden_BTH: torch.Tensor, mask_BT: torch.Tensor, pooling: str) -> torch.Tensor:
    """One vector per row from left-padded hidden states."""
    if pooling == "last":
        return hidden_BTH[:, -1]
    if pooling == "mean":
        m = mask_BT.to(hidden_BTH.dtype).unsqueeze(-1)
        return (hidden_BTH * m).sum(1) / m.sum(1).clamp(min=1.0)
    raise ValueError(f"unknown router pooling {pooling!r}; known: {', '.join(POOLINGS)}")


@torch.no_grad()
def prompt_features(
    causal_lm: Any,
    prompts: Sequence[Sequence[int]],
    pad_id: int,
    pooling: str = "last",
    batch_size: int = 8,
    autocast: Callable[[], AbstractContextManager] | None = None,
    layer: int = -1,
) -> torch.Tensor:
    """``[B, H]`` float32 prompt representations from the LM's hidden states (no grad: the
    router loss trains the head only). ``layer`` indexes the backbone's hidden states: −1 the
    final (normed) one, 0 the embeddings, k the output of block k; a middle block often separates
    what a prompt asks for better than the last, which is shaped for the next token."""
    backbone = causal_lm.get_decoder()
    was_training = causal_lm.training
    causal_lm.eval()
    out = []
    try:
        for s in range(0, len(prompts), batch_size):
            chunk = [list(p) for p in prompts[s : s + batch_size]]
            width = max(len(p) for p in chunk)
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for r, p in enumerate(chunk):
                ids[r, width - len(p) :] = torch.tensor(p, dtype=torch.long)
                mask[r, width - len(p) :] = 1
            device = next(backbone.parameters()).device  # trainer.device
            ids, mask = ids.to(device), mask.to(device)
            with autocast() if autocast is not None else nullcontext():
                got = backbone(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=position_ids_from_mask(mask),
                    use_cache=False,
                    output_hidden_states=layer != -1,
                )
                h = got.last_hidden_state if layer == -1 else got.hidden_states[layer]
            out.append(pool(h.float(), mask, pooling))
    finally:
        causal_lm.train(was_training)
    return torch.cat(out, dim=0)
