"""Weight sync: after ``sync_weights`` the engine samples from exactly the pushed weights (checked
against HF teacher forcing on the same weights), including the tied LM head that a plain reload
leaves stale; the engine keeps its own copy; restoring the weights restores the outputs bit for
bit."""

from __future__ import annotations

import pytest
import torch

from tests.vllm.conftest import BASE_VERSION, perturbed, recompute
from toolgrpo.rollout.generator import SamplingParams

pytestmark = pytest.mark.vllm

ATOL = 1e-3
PARAMS = SamplingParams(n=2, max_new_tokens=8)
GREEDY = SamplingParams(do_sample=False, max_new_tokens=8)


def _sample(gen, prompts, seed=11):
    torch.manual_seed(seed)
    return gen.generate(prompts, PARAMS)


def _check_pushed(out, pushed_ref: list[torch.Tensor], before_ref: list[torch.Tensor]) -> None:
    """The engine's log-probs equal HF's on the pushed weights, and HF's on the previous weights
    differ clearly (so a push that did not land would fail)."""
    moved = 0.0
    for c, want, before in zip(out, pushed_ref, before_ref, strict=True):
        torch.testing.assert_close(torch.tensor(c.logprobs), want, rtol=0, atol=ATOL)
        moved = max(moved, float((want - before).abs().max()))
    assert moved > 0.05, f"the perturbation barely moved the log-probs ({moved})"


def test_embedding_only_update_reaches_the_tied_lm_head(vgen, hf_policy, prompts):
    """SmolLM2 ties lm_head to embed_tokens: a reload without the head fix keeps sampling from
    the old output embedding (mean |Δ| 0.25 nats in the probe)."""
    model = hf_policy.model
    assert model.config.tie_word_embeddings
    with perturbed(model, ["model.embed_tokens.weight"], scale=0.5, seed=1):
        vgen.sync_weights(model, 1)
        out = _sample(vgen, prompts)
        pushed = [recompute(model, c)[0] for c in out]
    _check_pushed(out, pushed, [recompute(model, c)[0] for c in out])
    # The module is restored now, the engine is not: it holds a copy, not the trainer's tensors.
    again = _sample(vgen, prompts)
    assert [(c.token_ids, c.logprobs) for c in again] == [(c.token_ids, c.logprobs) for c in out]


def test_full_update_then_restore_is_bit_identical(vgen, hf_policy, prompts):
    model = hf_policy.model
    base, greedy = _sample(vgen, prompts), vgen.generate(prompts, GREEDY)
    with perturbed(model, None, scale=0.05, seed=2):
        vgen.sync_weights(model, 2)
        assert vgen.last_sync_s > 0
        syncs = vgen.syncs
        vgen.sync_weights(model, 2)  # the version it already has: skipped
        assert vgen.syncs == syncs
        out = _sample(vgen, prompts)
        pushed = [recompute(model, c)[0] for c in out]
    _check_pushed(out, pushed, [recompute(model, c)[0] for c in out])
    vgen.sync_weights(model, BASE_VERSION)  # the restored originals
    assert vgen.syncs == syncs + 1
    again = _sample(vgen, prompts)
    assert [(c.token_ids, c.logprobs) for c in again] == [(c.token_ids, c.logprobs) for c in base]
    assert vgen.generate(prompts, GREEDY) == greedy
