"""Chunked response log-probs against naive full-vocabulary computations on the tiny model."""

from __future__ import annotations

import pytest
import torch

from toolgrpo.config.schema import ModelConfig
from toolgrpo.models.loading import load_policy
from toolgrpo.models.logprobs import (
    length_buckets,
    masked_token_logprobs,
    position_ids_from_mask,
    response_logprobs,
    shared_prefix_logprobs,
)

PAD = 2


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    torch.manual_seed(0)
    model = load_policy(ModelConfig(path=str(tiny_model_dir), dtype="float32")).model
    model.eval()  # no dropout anyway; explicit for clarity
    return model


def _rand_ids(n, vocab, gen):
    return torch.randint(3, vocab, (n,), generator=gen)


def _batch(vocab, prompt_lens, resp_lens, seed=0):
    """Left-padded prompts + right-padded responses in verl's [B, P + R] layout."""
    g = torch.Generator().manual_seed(seed)
    P, R = max(prompt_lens), max(resp_lens)
    B = len(prompt_lens)
    ids = torch.full((B, P + R), PAD, dtype=torch.long)
    attn = torch.zeros((B, P + R), dtype=torch.long)
    rmask = torch.zeros((B, R))
    for i, (p, r) in enumerate(zip(prompt_lens, resp_lens, strict=True)):
        ids[i, P - p : P] = _rand_ids(p, vocab, g)
        attn[i, P - p : P] = 1
        ids[i, P : P + r] = _rand_ids(r, vocab, g)
        attn[i, P : P + r] = 1
        rmask[i, :r] = 1
    return ids, attn, rmask, R


def _naive(lm, ids, attn, R, temperature):
    out = lm(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn))
    logits = out.logits[:, -R - 1 : -1].float() / temperature
    logp = torch.log_softmax(logits, -1)
    lp = logp.gather(-1, ids[:, -R:, None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


def test_position_ids_skip_left_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 3]]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_response_logprobs_match_naive(lm, temperature):
    vocab = lm.config.vocab_size
    ids, attn, rmask, R = _batch(vocab, [5, 9, 3], [7, 4, 1])
    with torch.no_grad():
        res = response_logprobs(
            lm,
            ids,
            attn,
            R,
            temperature=temperature,
            chunk_size=3,
            with_entropy=True,
            with_hidden=True,
        )
        lp, ent = _naive(lm, ids, attn, R, temperature)
    m = rmask.bool()
    assert res.logprobs_BR.shape == (3, R) and res.logprobs_BR.dtype == torch.float32
    torch.testing.assert_close(res.logprobs_BR[m], lp[m], rtol=0, atol=1e-5)
    torch.testing.assert_close(res.entropy_BR[m], ent[m], rtol=0, atol=1e-5)
    assert res.hidden_BR.shape == (3, R, lm.config.hidden_size)
    # chunking does not change anything
    with torch.no_grad():
        whole = response_logprobs(lm, ids, attn, R, temperature, chunk_size=1000)
    torch.testing.assert_close(whole.logprobs_BR, res.logprobs_BR, rtol=0, atol=1e-6)
    assert whole.entropy_BR is None and whole.hidden_BR is None


def test_response_logprobs_grad_matches_naive(lm):
    vocab = lm.config.vocab_size
    ids, attn, rmask, R = _batch(vocab, [4, 6], [5, 3], seed=1)
    params = [p for p in lm.parameters() if p.requires_grad]

    lm.zero_grad()
    res = response_logprobs(lm, ids, attn, R, 0.7, chunk_size=2, with_entropy=True)
    ((res.logprobs_BR + 0.1 * res.entropy_BR) * rmask).sum().backward()
    chunked = [p.grad.clone() for p in params]

    lm.zero_grad()
    lp, ent = _naive(lm, ids, attn, R, 0.7)
    ((lp + 0.1 * ent) * rmask).sum().backward()
    naive = [p.grad.clone() for p in params]
    lm.zero_grad()
    for a, b in zip(chunked, naive, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def _shared_inputs(vocab, n=3, p=6, resp_lens=(5, 2, 4), seed=2):
    g = torch.Generator().manual_seed(seed)
    prompt = _rand_ids(p, vocab, g)
    R = max(resp_lens)
    resp = torch.full((n, R), PAD, dtype=torch.long)
    rmask = torch.zeros((n, R))
    for i, r in enumerate(resp_lens):
        resp[i, :r] = _rand_ids(r, vocab, g)
        rmask[i, :r] = 1
    ids = torch.cat([prompt.expand(n, -1), resp], dim=1)
    attn = torch.cat([torch.ones(n, p, dtype=torch.long), rmask.long()], dim=1)
    return prompt, resp, rmask, ids, attn, R


@pytest.mark.parametrize("resp_lens", [(5, 2, 4), (1, 1, 1)])
def test_shared_prefix_matches_response_logprobs(lm, resp_lens):
    vocab = lm.config.vocab_size
    prompt, resp, rmask, ids, attn, R = _shared_inputs(vocab, resp_lens=resp_lens)
    params = [p for p in lm.parameters() if p.requires_grad]
    m = rmask.bool()

    lm.zero_grad()
    a = shared_prefix_logprobs(
        lm, prompt, resp, temperature=0.7, chunk_size=2, with_entropy=True, with_hidden=True
    )
    ((a.logprobs_BR - 0.3 * a.entropy_BR) * rmask).sum().backward()
    grads_shared = [p.grad.clone() for p in params]

    lm.zero_grad()
    b = response_logprobs(
        lm, ids, attn, R, temperature=0.7, chunk_size=2, with_entropy=True, with_hidden=True
    )
    ((b.logprobs_BR - 0.3 * b.entropy_BR) * rmask).sum().backward()
    grads_full = [p.grad.clone() for p in params]
    lm.zero_grad()

    assert a.logprobs_BR.shape == b.logprobs_BR.shape == (3, R)
    torch.testing.assert_close(a.logprobs_BR[m], b.logprobs_BR[m], rtol=0, atol=1e-5)
    torch.testing.assert_close(a.entropy_BR[m], b.entropy_BR[m], rtol=0, atol=1e-5)
    torch.testing.assert_close(a.hidden_BR[m], b.hidden_BR[m], rtol=1e-4, atol=1e-5)
    for name_p, ga, gb in zip(
        [n for n, p in lm.named_parameters() if p.requires_grad],
        grads_shared,
        grads_full,
        strict=True,
    ):
        torch.testing.assert_close(ga, gb, rtol=1e-4, atol=1e-5, msg=name_p)
    assert any(g.abs().sum() > 0 for g in grads_shared)


@pytest.mark.parametrize("resp_lens", [(9, 1, 2, 8), (9, 2, 2, 3), (4, 4, 4, 4)])
def test_length_bucketed_shared_prefix_matches_padded(lm, resp_lens):
    """Running a group's responses in length buckets (issue #19: one 640-token episode beside
    60-token ones made the update pad every row to 640) gives the padded pass's log-probs,
    entropies, hidden states and gradients at every real position."""
    vocab = lm.config.vocab_size
    prompt, resp, rmask, _, _, _ = _shared_inputs(vocab, n=4, resp_lens=resp_lens, seed=5)
    params = [p for p in lm.parameters() if p.requires_grad]
    m = rmask.bool()
    outs, grads = [], []
    for lengths in (None, list(resp_lens)):
        lm.zero_grad()
        o = shared_prefix_logprobs(
            lm, prompt, resp, 0.7, 3, with_entropy=True, with_hidden=True, response_lengths=lengths
        )
        ((o.logprobs_BR - 0.3 * o.entropy_BR) * rmask).sum().backward()
        outs.append(o)
        grads.append([p.grad.clone() for p in params])
    lm.zero_grad()
    a, b = outs
    assert b.logprobs_BR.shape == b.entropy_BR.shape == a.logprobs_BR.shape
    assert b.hidden_BR.shape == a.hidden_BR.shape
    torch.testing.assert_close(b.logprobs_BR[m], a.logprobs_BR[m], rtol=0, atol=1e-5)
    torch.testing.assert_close(b.entropy_BR[m], a.entropy_BR[m], rtol=0, atol=1e-5)
    torch.testing.assert_close(b.hidden_BR[m], a.hidden_BR[m], rtol=1e-4, atol=1e-5)
    for ga, gb in zip(*grads, strict=True):
        torch.testing.assert_close(gb, ga, rtol=1e-4, atol=1e-5)


def test_length_buckets_bound_padding():
    """Buckets cover every row once and pad at most 25 % beyond their real tokens (single rows
    excepted); equal lengths share one bucket."""
    lengths = [640, 60, 80, 100, 620, 5, 0, 90]
    buckets = length_buckets(lengths)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    for b in buckets:
        longest = max(max(lengths[i], 1) for i in b)
        assert len(b) == 1 or len(b) * longest <= 1.25 * sum(max(lengths[i], 1) for i in b)
    padded = sum(len(b) * max(max(lengths[i], 1) for i in b) for b in buckets)
    assert padded <= 1.25 * sum(max(x, 1) for x in lengths)
    assert length_buckets([7, 7, 7, 7]) == [[0, 1, 2, 3]]


def test_masked_token_logprobs_match_naive(lm):
    vocab = lm.config.vocab_size
    g = torch.Generator().manual_seed(3)
    B, T = 3, 12
    lens = [12, 7, 9]
    ids = torch.full((B, T), PAD, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    target = torch.zeros((B, T), dtype=torch.long)
    for i, n in enumerate(lens):  # right padding, as SFT batches are built
        ids[i, :n] = _rand_ids(n, vocab, g)
        attn[i, :n] = 1
    target[0, 4:9] = 1
    target[1, 2:7] = 1
    target[2, 0:3] = 1  # position 0 can never be a target (nothing predicts it)
    target[2, 6:9] = 1
    with torch.no_grad():
        got = masked_token_logprobs(lm, ids, attn, target, chunk_size=4)
        logits = lm(
            input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn)
        ).logits.float()
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    want = logp[target[:, 1:].bool()]
    assert got.shape == want.shape == (int(target[:, 1:].sum()),)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_masked_token_logprobs_empty_mask(lm):
    ids = torch.tensor([[5, 6, 7]])
    out = masked_token_logprobs(lm, ids, torch.ones_like(ids), torch.zeros_like(ids))
    assert out.shape == (0,)


def _tool_mask(rmask: torch.Tensor, seed: int = 3) -> torch.Tensor:
    """A multi-turn-like target mask: real response tokens, with runs of 'tool output' zeroed."""
    g = torch.Generator().manual_seed(seed)
    keep = (torch.rand(rmask.shape, generator=g) > 0.5).float()
    return rmask * keep


@pytest.mark.parametrize("shared", [False, True])
def test_target_mask_scores_only_the_policy_tokens_with_the_same_values_and_gradients(lm, shared):
    """The LM head limited to mask-1 positions (#19: multi-turn rows are mostly tool output)
    gives the unmasked pass's log-probs, entropies and gradients there, and 0 elsewhere."""
    vocab = lm.config.vocab_size
    prompt, resp, rmask, ids, attn, R = _shared_inputs(vocab, n=4, resp_lens=(9, 2, 6, 8), seed=7)
    tmask = _tool_mask(rmask)
    assert 0 < tmask.sum() < rmask.sum()
    params = [p for p in lm.parameters() if p.requires_grad]

    def run(mask):
        lm.zero_grad()
        if shared:
            lengths = [9, 2, 6, 8]
            o = shared_prefix_logprobs(
                lm, prompt, resp, 0.7, 2, True, True, response_lengths=lengths, target_mask=mask
            )
        else:
            o = response_logprobs(lm, ids, attn, R, 0.7, 2, True, True, target_mask=mask)
        ((o.logprobs_BR - 0.3 * o.entropy_BR) * tmask).sum().backward()
        return o, [p.grad.clone() for p in params]

    full, g_full = run(None)
    part, g_part = run(tmask)
    lm.zero_grad()
    m = tmask.bool()
    torch.testing.assert_close(part.logprobs_BR[m], full.logprobs_BR[m], rtol=0, atol=1e-5)
    torch.testing.assert_close(part.entropy_BR[m], full.entropy_BR[m], rtol=0, atol=1e-5)
    assert (part.logprobs_BR[~m] == 0).all() and (part.entropy_BR[~m] == 0).all()
    assert part.hidden_BR.shape == full.hidden_BR.shape
    for ga, gb in zip(g_full, g_part, strict=True):
        torch.testing.assert_close(gb, ga, rtol=1e-4, atol=1e-5)
    assert any(g.abs().sum() > 0 for g in g_part)


def test_target_mask_with_no_scored_token_still_backpropagates(lm):
    """A micro-batch whose rows hold no policy token (all tool output) gives zeros and a loss
    that backward accepts, as before the head was masked."""
    vocab = lm.config.vocab_size
    ids, attn, rmask, R = _batch(vocab, [4, 3], [3, 2])
    o = response_logprobs(lm, ids, attn, R, 1.0, 2, True, target_mask=torch.zeros_like(rmask))
    assert o.logprobs_BR.shape == (2, R) and (o.logprobs_BR == 0).all()
    (o.logprobs_BR.sum() + o.entropy_BR.sum()).backward()
    lm.zero_grad()
