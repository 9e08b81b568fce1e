"""``direct`` with ``offer_tools``: the calculator's and search's real tools are offered although
the question needs none. Off by default (nothing changes); on, a call runs like in its own
environment and shows in the episode's transcript; bad values are refused when the router is built.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from transformers import AutoTokenizer

from toolgrpo.data.task import Task
from toolgrpo.envs.base import Transcript
from toolgrpo.envs.direct import SYSTEM_PROMPT, tools_prompt
from toolgrpo.envs.registry import EnvConfigError, EnvRouter
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.generator import Completion, SamplingParams
from toolgrpo.rollout.multi_turn import EpisodeLimits, play_task
from toolgrpo.tools.parser import parse_tool_calls

TASK = Task("direct#0", ({"role": "user", "content": "What is 3 + 4?"},), "7", "direct", "direct")
CALC = '<tool_call>{"name": "calculate", "arguments": {"expression": "3 + 4"}}</tool_call>'


def start(options=None, task=TASK):
    env = EnvRouter({"direct": options} if options is not None else None).make(task)
    return env, asyncio.run(env.reset())


def names(s) -> list[str]:
    return [t["function"]["name"] for t in s.tools]


def test_default_is_unchanged_no_tools_and_the_old_prompt():
    for options in (None, {}, {"offer_tools": False}, {"offer_tools": []}):
        env, s = start(options)
        assert s.tools == [] and env.tools == {} and env.max_turns == 2
        assert s.messages == [{"role": "system", "content": SYSTEM_PROMPT}, dict(TASK.messages[0])]
        assert env.reward_range is None and env.supports_snapshot


def test_offer_tools_offers_the_calculator_and_search_specs_unchanged():
    env, s = start({"offer_tools": True})
    calc = asyncio.run(
        EnvRouter().make(Task("c", TASK.messages, "7", "calculator", "calculator")).reset()
    )
    srch = asyncio.run(EnvRouter().make(Task("s", TASK.messages, "7", "search", "search")).reset())
    assert (
        s.tools == calc.tools + srch.tools
    )  # same names and specs: the router's families know them
    assert names(s) == ["calculate", "solve", "search", "open_document"]
    assert s.messages[0] == {"role": "system", "content": tools_prompt(("calculator", "search"))}
    assert env.max_turns == 2 and env.supports_snapshot and env.reward_range == (0.0, 1.0)
    _, only = start({"offer_tools": ["calculator"], "max_turns": 3})
    assert names(only) == ["calculate", "solve"] and "search" not in only.messages[0]["content"]
    _, only = start({"offer_tools": ["search"]})
    assert names(only) == ["search", "open_document"]


def test_offered_tools_run_and_do_not_change_the_reward():
    env, s = start({"offer_tools": True, "timeout_s": 5})
    search = '{"name": "search", "arguments": {"query": "capital of Yarostia"}}'
    turn = f"{CALC}\n<tool_call>{search}</tool_call>"
    calc, found = asyncio.run(env.step(parse_tool_calls(turn)))
    assert (calc.is_error, calc.text) == (False, "7")
    assert not found.is_error and "doc_id: province-000" in found.text
    for answer, score in (("<answer>7</answer>", 1.0), ("<answer>8</answer>", 0.0), ("7", 0.0)):
        msgs = [*s.messages, {"role": "assistant", "content": answer}]
        assert asyncio.run(env.reward(Transcript(msgs, "", "answer", 1))).score == score


def test_a_task_system_prompt_is_kept():
    task = Task(
        "d", ({"role": "system", "content": "mine"}, *TASK.messages), "7", "direct", "direct"
    )
    _, s = start({"offer_tools": True}, task)
    assert s.messages[0]["content"] == "mine" and len(s.tools) == 4


@pytest.mark.parametrize(
    "options, match",
    [
        ({"offer_tools": "yes"}, "offer_tools must be true, false or a list"),
        ({"offer_tools": 1}, "offer_tools must be true, false or a list"),
        ({"offer_tools": ["calculator", "web"]}, "'web'"),
        ({"offer_tools": "calculator"}, "got 'calculator'"),
        ({"timeout_s": 0}, "timeout_s must be a number > 0"),
        ({"timeout_s": "soon"}, "timeout_s must be a number > 0"),
        ({"offer_tools": True, "top_k": 3}, r"unknown direct option\(s\) \['top_k'\]"),
    ],
)
def test_bad_options_are_refused_when_the_router_is_built(options, match):
    with pytest.raises(EnvConfigError, match=match):
        EnvRouter({"direct": options})  # at startup, not when an episode starts


def test_answer_route_removes_every_tool_and_every_sentence_about_them():
    """The ANSWER route must turn the tool-offering prompt into a plain no-tools one."""
    from toolgrpo.router.families import FamilyMap
    from toolgrpo.router.prompts import ANSWER_NOTE, condition_start

    _, s = start({"offer_tools": True})
    answer = condition_start(s, "ANSWER", FamilyMap())
    own, _, note = answer.messages[0]["content"].partition("\n\n")
    assert answer.tools == [] and note == ANSWER_NOTE
    assert own == (
        "You are a careful assistant.\nReply with the final answer only, as "
        "<answer>ANSWER</answer> (a number or a short phrase)."
    )
    calc = condition_start(s, "CALCULATE", FamilyMap())
    assert "calculate" in calc.messages[0]["content"] and len(calc.tools) == 4


# ---- one episode through the real loop: the call shows in the transcript -------------------------
@dataclass
class Scripted:
    """Writes ``turns[k]`` as the k-th assistant turn of every prompt."""

    tokenizer: object
    turns: list[str]

    @property
    def eos_ids(self) -> list[int]:
        return [self.tokenizer.convert_tokens_to_ids("<|im_end|>")]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        out = []
        for i, p in enumerate(prompts):
            k = self.tokenizer.decode(p).count("<|im_start|>assistant") - 1
            text = self.turns[min(k, len(self.turns) - 1)]
            ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], *self.eos_ids]
            out.extend(
                Completion(i, list(p), ids, [-0.1] * len(ids), "stop") for _ in range(params.n)
            )
        return out


def test_episode_runs_the_call_and_its_result_is_in_the_transcript(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    env, _ = start({"offer_tools": True})
    batcher = GenerationBatcher(
        Scripted(tok, [CALC, "<answer>7</answer>"]), SamplingParams(max_new_tokens=64)
    )
    limits = EpisodeLimits(max_prompt_length=4096, max_response_length=400)
    try:
        ep = asyncio.run(play_task(TASK, env, batcher, tok, limits, uid="u"))
    finally:
        batcher.close()
    assert ep.stop_reason == "answer", (ep.stop_reason, ep.env_failure)
    assert (ep.tool_calls, ep.tool_errors, ep.num_turns, ep.reward) == (1, 0, 2, 1.0)
    roles = [m["role"] for m in ep.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert "calculate" in ep.messages[2]["content"] and ep.messages[3]["content"] == "7"
