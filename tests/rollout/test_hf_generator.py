"""HF generation backend: ordering, recorded log-probs, truncation, greedy, EOS handling."""

from __future__ import annotations

import pytest
import torch

from toolgrpo.config.schema import ModelConfig
from toolgrpo.models.loading import load_policy
from toolgrpo.models.logprobs import response_logprobs
from toolgrpo.rollout.generator import Completion, SamplingParams
from toolgrpo.rollout.hf import HFGenerator, stop_token_ids
from toolgrpo.rollout.prompts import PromptTooLong, filter_overlong, render_prompt
from toolgrpo.rollout.single_turn import rollout_tasks, solution_text


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return load_policy(ModelConfig(path=str(tiny_model_dir), dtype="float32"))


@pytest.fixture(scope="module")
def prompts(policy):
    tok = policy.tokenizer
    texts = ["call the tool", "what is the weather in Paris today, please?", "hi"]
    return [render_prompt(tok, [{"role": "user", "content": t}], 4096) for t in texts]


def _gen(policy, batch_size=16):
    return HFGenerator(policy.model, policy.tokenizer, policy.dtype, batch_size=batch_size)


def _recompute(policy, c: Completion, temperature: float) -> torch.Tensor:
    ids = torch.tensor([c.prompt_ids + c.token_ids])
    with torch.no_grad():
        return response_logprobs(
            policy.base, ids, torch.ones_like(ids), len(c.token_ids), temperature
        ).logprobs_BR[0]


@pytest.mark.parametrize("batch_size", [16, 4, 1])
def test_n_completions_per_prompt_in_prompt_order(policy, prompts, batch_size):
    torch.manual_seed(0)
    params = SamplingParams(n=3, max_new_tokens=6)
    out = _gen(policy, batch_size).generate(prompts, params)
    assert len(out) == 3 * len(prompts)
    assert [c.prompt_index for c in out] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for c in out:
        assert c.prompt_ids == prompts[c.prompt_index]
        assert len(c.logprobs) == len(c.token_ids) >= 1
        assert c.finish_reason in ("stop", "length")
        assert all(lp <= 0 for lp in c.logprobs)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recorded_logprobs_equal_recompute(policy, prompts, temperature):
    torch.manual_seed(1)
    params = SamplingParams(n=2, temperature=temperature, max_new_tokens=8)
    assert not params.truncated
    out = _gen(policy).generate(prompts, params)
    for c in out:
        want = _recompute(policy, c, temperature)
        torch.testing.assert_close(torch.tensor(c.logprobs), want, rtol=0, atol=1e-4)


def test_top_k_logprobs_are_the_sampling_distribution(policy, prompts):
    torch.manual_seed(2)
    k, temperature = 5, 0.8
    params = SamplingParams(n=2, temperature=temperature, top_k=k, max_new_tokens=8)
    assert params.truncated
    out = _gen(policy).generate(prompts, params)
    differs = False
    for c in out:
        ids = torch.tensor([c.prompt_ids + c.token_ids])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0].float() / temperature
        P, R = len(c.prompt_ids), len(c.token_ids)
        step_logits = logits[P - 1 : P + R - 1]  # the logits each response token was drawn from
        top = step_logits.topk(k, dim=-1)
        targets = torch.tensor(c.token_ids)
        # every sampled token is inside the top-k
        assert (top.indices == targets[:, None]).any(-1).all()
        truncated = step_logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(
            top.values, -1
        )
        full = torch.log_softmax(step_logits, -1).gather(-1, targets[:, None]).squeeze(-1)
        got = torch.tensor(c.logprobs)
        torch.testing.assert_close(got, truncated, rtol=0, atol=1e-4)
        differs |= bool((got - full).abs().max() > 1e-3)
    assert differs, "top-k log-probs should differ from the untruncated softmax"


def test_top_p_logprobs_are_renormalised(policy, prompts):
    torch.manual_seed(3)
    params = SamplingParams(n=2, top_p=0.5, max_new_tokens=6)
    out = _gen(policy).generate(prompts, params)
    for c in out:
        full = _recompute(policy, c, 1.0)
        got = torch.tensor(c.logprobs)
        # renormalising over a nucleus can only raise a kept token's log-prob
        assert (got >= full - 1e-4).all()
        assert (got <= 1e-6).all()


def test_greedy_is_deterministic(policy, prompts):
    params = SamplingParams(n=2, do_sample=False, temperature=0.0, max_new_tokens=8)
    torch.manual_seed(4)
    a = _gen(policy).generate(prompts, params)
    torch.manual_seed(5)
    b = _gen(policy).generate(prompts, params)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    for c in a:
        want = _recompute(policy, c, 1.0)
        torch.testing.assert_close(torch.tensor(c.logprobs), want, rtol=0, atol=1e-4)
    # the n greedy samples of one prompt are identical
    assert a[0].token_ids == a[1].token_ids


def test_greedy_batch_equals_each_prompt_alone(policy, prompts):
    """Left padding and the shared prefill must not change what a prompt generates."""
    params = SamplingParams(n=1, do_sample=False, max_new_tokens=8)
    batched = _gen(policy).generate(prompts, params)
    for i, p in enumerate(prompts):
        alone = _gen(policy).generate([p], params)[0]
        assert batched[i].token_ids == alone.token_ids
        torch.testing.assert_close(
            torch.tensor(batched[i].logprobs), torch.tensor(alone.logprobs), rtol=0, atol=1e-4
        )


def test_seeded_sampling_is_reproducible(policy, prompts):
    params = SamplingParams(n=2, max_new_tokens=8)
    torch.manual_seed(6)
    a = _gen(policy).generate(prompts, params)
    torch.manual_seed(6)
    b = _gen(policy).generate(prompts, params)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]


class _EosBiasedHead(torch.nn.Module):
    """The tied LM head plus a constant bias towards EOS, so some samples stop early."""

    def __init__(self, head: torch.nn.Module, eos: int, bias: float):
        super().__init__()
        self.head = head
        self.eos = eos
        self.bias = bias

    @property
    def weight(self):
        return self.head.weight

    def forward(self, h):
        out = self.head(h)
        add = torch.zeros(out.shape[-1], dtype=out.dtype)
        add[self.eos] = self.bias
        return out + add


def test_finish_reasons_and_eos(tiny_model_dir, prompts):
    policy = load_policy(ModelConfig(path=str(tiny_model_dir), dtype="float32"), trainable=False)
    tok = policy.tokenizer
    eos_ids = set(stop_token_ids(tok))
    assert tok.convert_tokens_to_ids("<|im_end|>") in eos_ids
    policy.model.lm_head = _EosBiasedHead(policy.model.lm_head, tok.eos_token_id, 4.0)
    max_new = 10
    params = SamplingParams(n=8, max_new_tokens=max_new)
    reasons = set()
    for seed in range(5):
        torch.manual_seed(seed)
        for c in _gen(policy).generate(prompts, params):
            assert len(c.logprobs) == len(c.token_ids)
            if c.finish_reason == "stop":
                assert c.token_ids[-1] in eos_ids
                assert not eos_ids & set(c.token_ids[:-1])
                assert 1 <= len(c.token_ids) <= max_new
                # the EOS log-prob is recorded like any other token
                want = _recompute(policy, c, 1.0)
                torch.testing.assert_close(torch.tensor(c.logprobs), want, rtol=0, atol=1e-4)
            else:
                assert c.finish_reason == "length"
                assert len(c.token_ids) == max_new
                assert not eos_ids & set(c.token_ids)
            reasons.add(c.finish_reason)
        if reasons == {"stop", "length"}:
            break
    assert reasons == {"stop", "length"}


def test_generation_restores_train_mode(policy, prompts):
    policy.model.train()
    _gen(policy).generate(prompts[:1], SamplingParams(max_new_tokens=2))
    assert policy.model.training
    policy.model.eval()
    _gen(policy).generate(prompts[:1], SamplingParams(max_new_tokens=2))
    assert not policy.model.training


def test_single_token_prompt(policy):
    out = _gen(policy).generate([[policy.tokenizer.bos_token_id]], SamplingParams(max_new_tokens=3))
    assert len(out) == 1 and 1 <= len(out[0].token_ids) <= 3


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n": 0},
        {"n": -1},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"temperature": 0.0},
        {"temperature": -1.0},
        {"max_new_tokens": 0},
    ],
)
def test_sampling_params_rejects(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_sampling_params_accepts_greedy_with_zero_temperature():
    p = SamplingParams(temperature=0.0, do_sample=False)
    assert not p.truncated
    assert SamplingParams(top_k=5).truncated
    assert SamplingParams(top_p=0.9).truncated
    assert not SamplingParams(top_k=5, do_sample=False).truncated


def test_render_prompt_truncation(policy):
    tok = policy.tokenizer
    msgs = [{"role": "user", "content": "a fairly long message " * 10}]
    full = render_prompt(tok, msgs, 10**6)
    assert tok.decode(full).endswith("<|im_start|>assistant\n")
    assert render_prompt(tok, msgs, 10) == full[-10:]
    with pytest.raises(PromptTooLong):
        render_prompt(tok, msgs, 10, truncation="error")
    with pytest.raises(ValueError):
        render_prompt(tok, msgs, 10, truncation="middle")


def test_filter_overlong_and_rollout_tasks(policy):
    from toolgrpo.data.task import Task

    short = Task("a#0", ({"role": "user", "content": "hi"},), "gt")
    long = Task("a#1", ({"role": "user", "content": "word " * 200},), "gt")
    limit = len(render_prompt(policy.tokenizer, short.messages, 10**6)) + 5
    assert filter_overlong(policy.tokenizer, [short, long], limit) == [short]
    with pytest.raises(ValueError, match="every prompt"):
        filter_overlong(policy.tokenizer, [long], limit)
    torch.manual_seed(0)
    out = rollout_tasks(
        _gen(policy),
        policy.tokenizer,
        [short, long],
        SamplingParams(n=2, max_new_tokens=3),
        max_prompt_length=limit,
    )
    assert [c.prompt_index for c in out] == [0, 0, 1, 1]
    assert all(len(c.prompt_ids) <= limit for c in out)
    text = solution_text(policy.tokenizer, out[0])
    assert text.startswith(policy.tokenizer.decode(out[0].prompt_ids, skip_special_tokens=False))
    assert "<|im_start|>assistant\n" in text


def _first_stop_end(tok, tokens: list[int], stop: str) -> int | None:
    """Brute force: the shortest prefix whose text contains ``stop``."""
    for k in range(len(tokens)):
        if stop in tok.decode(tokens[: k + 1], skip_special_tokens=False):
            return k
    return None


def test_stop_strings_end_a_completion_after_the_completing_token(policy, prompts):
    """Seeded, so the run with a stop string replays the run without one up to the cut (HF
    keeps sampling finished rows, then pads them); a row whose text never contains the string
    is left exactly as it was."""
    tok, gen = policy.tokenizer, _gen(policy)
    gen.eos_ids = []  # the random model must not end early: the cut comes from the string
    torch.manual_seed(4)
    free = gen.generate(prompts, SamplingParams(max_new_tokens=16))
    words = [tok.decode([t]).strip() for t in free[1].token_ids[3:]]
    stop = next(w for w in words if w.isascii() and w.isalpha())
    want = {i: _first_stop_end(tok, c.token_ids, stop) for i, c in enumerate(free)}
    assert want[1] is not None and want[1] < 15
    torch.manual_seed(4)
    out = gen.generate(prompts, SamplingParams(max_new_tokens=16, stop=(stop,)))
    for i, (c, f) in enumerate(zip(out, free, strict=True)):
        if want[i] is None:
            assert (c.token_ids, c.finish_reason) == (f.token_ids, "length")
            continue
        end = want[i] + 1
        assert c.token_ids == f.token_ids[:end] and c.finish_reason == "stop"
        assert stop in tok.decode(c.token_ids) and stop not in tok.decode(c.token_ids[:-1])
        torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(f.logprobs[:end]))


def test_bad_stop_strings_are_refused():
    with pytest.raises(ValueError, match="stop strings"):
        SamplingParams(stop=("",))


# ---- issue #17, item 6: a model's generation_config must not reshape sampling after the recorder
@pytest.fixture(scope="module")
def sharp_policy(tiny_model_dir):
    """A private copy of the tiny model with peaked next-token distributions (random init is
    nearly flat, so truncating warpers would remove almost nothing)."""
    p = load_policy(ModelConfig(path=str(tiny_model_dir), dtype="float32"), trainable=False)
    with torch.no_grad():
        p.model.model.norm.weight.mul_(8.0)
    return p


@pytest.mark.parametrize(
    "key, value",
    [
        ("min_p", 0.3),
        ("typical_p", 0.3),
        ("epsilon_cutoff", 0.03),
        ("eta_cutoff", 0.03),
        ("top_h", 0.3),
    ],
)
def test_recorded_logprobs_describe_the_sampled_distribution_despite_generation_config(
    sharp_policy, prompts, key, value
):
    """Pins the defect: HF applied these generation_config.json settings *after* our recorder,
    so tokens were drawn from a truncated distribution while the recorded log-probs described
    the untruncated one. Empirical frequencies of 1-token samples must match exp(recorded)."""
    gc = sharp_policy.model.generation_config
    setattr(gc, key, value)
    try:
        torch.manual_seed(3)
        n = 3000
        params = SamplingParams(n=n, temperature=1.0, max_new_tokens=1)
        out = HFGenerator(sharp_policy.model, sharp_policy.tokenizer, torch.float32, n).generate(
            prompts[:1], params
        )
        assert sharp_policy.model.generation_config is gc  # restored after the call
    finally:
        setattr(gc, key, None)
    tokens = torch.tensor([c.token_ids[0] for c in out])
    recorded = {int(t): c.logprobs[0] for t, c in zip(tokens, out, strict=True)}
    counts = torch.bincount(tokens, minlength=max(recorded) + 1).double() / n
    q = torch.zeros_like(counts)
    for t, lp in recorded.items():
        q[t] = float(torch.tensor(lp).exp())
    full = torch.softmax(
        sharp_policy.model(input_ids=torch.tensor([prompts[0]])).logits[0, -1].double(), -1
    )
    seen = list(recorded)
    assert (full[seen] - q[seen]).abs().max() < 1e-4  # recorded = the untruncated distribution
    # ... so the samples must come from it: the most frequent tokens' frequencies match q
    top = torch.argsort(counts, descending=True)[:5]
    tol = 4 * (q[top] * (1 - q[top]) / n).sqrt() + 0.01
    assert ((counts[top] - q[top]).abs() < tol).all(), (counts[top], q[top])
