"""The episode loop on decoded tokens: what the policy sampled is mask 1 with its log-probs, and
everything else (tool output, template markers, follow-up user turns) is mask 0."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from transformers import AutoTokenizer

from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env, EnvReward, EnvStart, Transcript
from toolgrpo.envs.registry import EnvRouter, register_env
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.generator import Completion, SamplingParams
from toolgrpo.rollout.multi_turn import EpisodeLimits, play_task, play_tasks
from toolgrpo.rollout.render import render_text
from toolgrpo.tools.types import ToolCall, ToolResult


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@dataclass
class ScriptedGenerator:
    """Plays a fixed list of assistant texts (one per turn, per prompt) and records every call."""

    tokenizer: object
    turns: list[str]
    calls: list[list[list[int]]] = field(default_factory=list)
    sampled: list[list[int]] = field(default_factory=list)

    @property
    def eos_ids(self) -> list[int]:
        return [self.tokenizer.convert_tokens_to_ids("<|im_end|>")]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        self.calls.append(prompts)
        out = []
        for i, p in enumerate(prompts):
            for _ in range(params.n):
                turn = self._turn_of(p)
                ids = self.tokenizer(self.turns[turn], add_special_tokens=False)["input_ids"]
                ids = list(ids) + self.eos_ids
                lps = [-0.01 * (k + 1) for k in range(len(ids))]
                self.sampled.append(ids)
                out.append(Completion(i, list(p), ids, lps, "stop"))
        return out

    def _turn_of(self, prompt: list[int]) -> int:
        text = self.tokenizer.decode(prompt, skip_special_tokens=False)
        return min(text.count("<|im_start|>assistant") - 1, len(self.turns) - 1)


class AddEnv(Env):
    """``add(a, b)``; ``fail`` makes every call an error; a second user turn when ``follow_up``."""

    def __init__(
        self, fail: bool = False, follow_up: bool = False, max_turns: int = 4, q: str = "2+3"
    ) -> None:
        self.fail, self.follow_up, self.max_turns, self.q = fail, follow_up, max_turns, q
        self.asked = False

    async def reset(self) -> EnvStart:
        spec = {
            "type": "function",
            "function": {
                "name": "add",
                "description": "a+b",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"],
                },
            },
        }
        return EnvStart([{"role": "user", "content": f"what is {self.q}?"}], [spec])

    async def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        if self.fail:
            return [ToolResult("Error: boom", True, "exception", c.name, c.id) for c in calls]
        return [
            ToolResult(f"RESULT={c.arguments['a'] + c.arguments['b']}", name=c.name, call_id=c.id)
            for c in calls
        ]

    async def next_user_turn(self, messages):
        if self.follow_up and not self.asked:
            self.asked = True
            return [{"role": "user", "content": "and now say done"}]
        return None

    async def reward(self, transcript: Transcript) -> EnvReward:
        last = transcript.messages[-1]["content"]
        return EnvReward(float("<answer>5</answer>" in last), {"turns": transcript.num_turns})


CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
TASK = Task("t0", ({"role": "user", "content": "x"},), "5", "test", "add")


def _spans(mask: list[int]) -> list[tuple[int, int, int]]:
    spans, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            spans.append((mask[start], start, i))
            start = i
    return spans


LIMITS = EpisodeLimits(max_response_length=400)


def _play(tok, turns, env, limits=LIMITS):
    gen = ScriptedGenerator(tok, turns)
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    ep = asyncio.run(play_task(TASK, env, batcher, tok, limits, uid="u"))
    batcher.close()
    return ep, gen


def test_mask_one_tokens_are_exactly_what_was_sampled(tok):
    ep, gen = _play(tok, [CALL, "<answer>5</answer>"], AddEnv())
    assert ep.stop_reason == "answer" and ep.num_turns == 2 and ep.reward == 1.0
    ones = [s for s in _spans(ep.response_mask) if s[0] == 1]
    assert [ep.response_ids[a:b] for _, a, b in ones] == gen.sampled
    for _, a, b in ones:  # log-probs are the ones the generator returned, token for token
        assert ep.logprobs[a:b] == [-0.01 * (k + 1) for k in range(b - a)]


def test_mask_zero_tokens_are_template_and_tool_output(tok):
    ep, _ = _play(tok, [CALL, "<answer>5</answer>"], AddEnv())
    zeros = [s for s in _spans(ep.response_mask) if s[0] == 0]
    assert len(zeros) == 1
    text = tok.decode(ep.response_ids[zeros[0][1] : zeros[0][2]], skip_special_tokens=False)
    assert "RESULT=5" in text and "<|im_start|>" in text and text.endswith("assistant\n")
    assert "<tool_call>" not in text and "<answer>" not in text
    assert all(lp == 0.0 for lp in ep.logprobs[zeros[0][1] : zeros[0][2]])
    # Token accumulation extends exactly: the stream decodes to the conversation's own rendering.
    full = tok.decode(ep.prompt_ids + ep.response_ids, skip_special_tokens=False)
    assert ep.prefix_mismatches == 0
    assert full == render_text(tok, ep.messages, None, False).rstrip("\n")


class StopAtToolCall(ScriptedGenerator):
    """A turn cut by the stop string "</tool_call>" ends with it, not with a stop token."""

    def generate(self, prompts, params):
        assert params.stop == ("</tool_call>",)
        out = super().generate(prompts, params)
        for k, c in enumerate(out):
            if self.turns[self._turn_of(c.prompt_ids)].endswith("</tool_call>"):
                c.token_ids, c.logprobs = c.token_ids[:-1], c.logprobs[:-1]  # no stop token
                self.sampled[len(self.sampled) - len(out) + k] = c.token_ids
        return out


def test_a_turn_ended_by_a_stop_string_is_closed_by_the_template(tok):
    """The turn's text stands as sampled (mask 1); the template's closing tokens that follow it
    are context (mask 0), and the stream still extends exactly."""
    gen = StopAtToolCall(tok, [CALL, "<answer>5</answer>"])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64, stop=("</tool_call>",)))
    ep = asyncio.run(play_task(TASK, AddEnv(), batcher, tok, LIMITS, uid="u"))
    batcher.close()
    assert ep.stop_reason == "answer" and ep.reward == 1.0 and ep.num_turns == 2
    assert ep.prefix_mismatches == 0
    ones = [s for s in _spans(ep.response_mask) if s[0] == 1]
    assert [ep.response_ids[a:b] for _, a, b in ones] == gen.sampled
    assert tok.decode(gen.sampled[0]).endswith("</tool_call>")
    closing = tok.decode(ep.response_ids[ones[0][2] : ones[1][1]], skip_special_tokens=False)
    assert closing.startswith("<|im_end|>") and "RESULT=5" in closing


def test_each_generation_prompt_extends_the_previous_tokens(tok):
    _, gen = _play(tok, [CALL, CALL, "<answer>5</answer>"], AddEnv())
    prompts = [c[0] for c in gen.calls]
    for prev, nxt in zip(prompts, prompts[1:], strict=False):
        assert nxt[: len(prev)] == prev


def test_follow_up_user_turn_and_max_turns(tok):
    ep, _ = _play(tok, ["<answer>5</answer>", "done"], AddEnv(follow_up=True))
    assert ep.num_turns == 2 and ep.stop_reason == "answer"
    assert "and now say done" in tok.decode(ep.response_ids)
    ep, _ = _play(tok, [CALL], AddEnv(max_turns=3))
    assert ep.num_turns == 3 and ep.stop_reason == "max_turns" and ep.tool_calls == 3
    assert ep.truncated  # the last turn's calls ran, but the model had work under way


def test_tool_errors_are_counted_and_shown(tok):
    ep, _ = _play(tok, [CALL, "<answer>5</answer>"], AddEnv(fail=True))
    assert ep.tool_errors == 1 and ep.tool_error_types == {"exception": 1}
    assert "Error: boom" in tok.decode(ep.response_ids)


class SlowAddEnv(AddEnv):
    async def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        await asyncio.sleep(0.05)
        return await super().step(calls)


def test_time_inside_tool_calls_is_measured(tok):
    """Issue #19: a multi-turn step's split names the tools' share (timing/tool_s); an episode
    whose tools take 2 × 50 ms reports at least that, one without tool calls reports ~0."""
    from toolgrpo.trainer.episode_metrics import episode_metrics

    slow, _ = _play(tok, [CALL, CALL, "<answer>5</answer>"], SlowAddEnv())
    assert slow.tool_calls == 2 and slow.tool_seconds >= 0.1
    none, _ = _play(tok, ["<answer>5</answer>"], SlowAddEnv())
    assert none.tool_calls == 0 and none.tool_seconds == 0.0
    m = episode_metrics([slow, none])
    assert m["timing/tool_s"] == pytest.approx(slow.tool_seconds)
    per_type = f"episode/{slow.task_type}/tool_seconds/mean"
    assert m[per_type] == pytest.approx(slow.tool_seconds / 2)


def test_malformed_call_is_reported_to_the_model(tok):
    ep, _ = _play(tok, ["<tool_call>{not json</tool_call>", "<answer>5</answer>"], AddEnvReal())
    assert ep.tool_errors == 1 and ep.num_turns == 2


class AddEnvReal(AddEnv):
    """Uses the real executor so parse errors come back as tool results."""

    async def step(self, calls):
        from toolgrpo.tools.executor import run_tool_calls
        from toolgrpo.tools.schema import function_tool

        def add(a: int, b: int) -> int:
            """Add two integers.

            Args:
                a: first
                b: second
            """
            return a + b

        return await run_tool_calls({"add": function_tool(add)}, calls, timeout_s=5)


def test_context_budget_truncates(tok):
    ep, _ = _play(tok, [CALL] * 10, AddEnv(max_turns=10), EpisodeLimits(max_response_length=60))
    assert ep.truncated and ep.stop_reason in ("context", "length")
    assert len(ep.response_ids) <= 60


def test_prompt_too_long(tok):
    ep, _ = _play(tok, [CALL], AddEnv(), EpisodeLimits(max_prompt_length=5))
    assert ep.stop_reason == "prompt_too_long" and ep.response_ids == []


@register_env("test_add")
def _make(task, options):
    return AddEnv(q=task.task_id, **options)


def test_groups_share_uid_and_first_turn_is_one_call(tok):
    gen = ScriptedGenerator(tok, [CALL, "<answer>5</answer>"])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    router = EnvRouter({"add": {"type": "test_add", "max_turns": 4}})
    tasks = [TASK, Task("t1", TASK.messages, "5", "test", "add")]
    eps = asyncio.run(play_tasks(tasks, 3, router, batcher, tok, EpisodeLimits(512)))
    batcher.close()
    assert [e.task_id for e in eps] == ["t0"] * 3 + ["t1"] * 3
    assert len({e.uid for e in eps[:3]}) == 1 and eps[0].uid != eps[3].uid
    assert all(e.reward == 1.0 for e in eps)
    # Six episodes, two turns each: the concurrent requests of a turn go out as one backend
    # call, and each task's identical prompts are sent once with n=3.
    assert [len(c) for c in gen.calls] == [2, 2] and len(gen.sampled) == 12


@dataclass
class AsyncScripted(ScriptedGenerator):
    """A generator with its own scheduler (like vLLM's async engine): ``agenerate`` per request."""

    async def agenerate(self, prompt: list[int], params: SamplingParams) -> list[Completion]:
        await asyncio.sleep(0)
        return self.generate([prompt], params)


def test_an_agenerate_backend_gets_every_turn_as_its_own_request(tok):
    gen = AsyncScripted(tok, [CALL, "<answer>5</answer>"])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    router = EnvRouter({"add": {"type": "test_add", "max_turns": 4}})
    eps = asyncio.run(play_tasks([TASK], 3, router, batcher, tok, EpisodeLimits(512)))
    batcher.close()
    assert all(e.reward == 1.0 and e.num_turns == 2 for e in eps)
    assert [len(c) for c in gen.calls] == [1] * 6 and batcher.calls == batcher.requests == 6
    for e in eps:  # the mask still trains exactly the sampled turns
        sampled = [t for t, m in zip(e.response_ids, e.response_mask, strict=True) if m]
        assert sampled == gen.sampled[0] + gen.sampled[-1]


class Broken(ScriptedGenerator):
    def generate(self, prompts, params):
        raise RuntimeError("engine died")


@dataclass
class AsyncBroken(ScriptedGenerator):
    async def agenerate(self, prompt, params):
        raise RuntimeError("engine died")


@pytest.mark.parametrize("cls", [Broken, AsyncBroken])
def test_a_backend_failure_stops_the_rollout_instead_of_scoring_it(tok, cls):
    """A dead engine is not an environment error: scoring its episodes -1 would train on noise."""
    from toolgrpo.rollout.generator import GenerationError

    batcher = GenerationBatcher(cls(tok, [CALL]), SamplingParams(max_new_tokens=64))
    router = EnvRouter({"add": {"type": "test_add", "max_turns": 4}})
    with pytest.raises(GenerationError, match="RuntimeError: engine died"):
        asyncio.run(play_tasks([TASK], 2, router, batcher, tok, EpisodeLimits(512)))
    batcher.close()


def test_router_errors():
    from toolgrpo.envs.registry import EnvConfigError

    with pytest.raises(EnvConfigError, match="unknown environment type 'nope'"):
        EnvRouter({"x": {"type": "nope"}})
    with pytest.raises(EnvConfigError, match="max_turns"):
        EnvRouter({"x": {"type": "test_add", "max_turns": 0}})
    with pytest.raises(EnvConfigError, match="no environment for task_type 'zzz'"):
        EnvRouter({}).check({"zzz"})
