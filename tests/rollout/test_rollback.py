"""Tool rollback in the episode loop: a failing turn is undone (tokens, messages, environment)
and sampled again; the failed attempt is kept as a negative sample under a per-group cap."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
from transformers import AutoTokenizer

from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env, EnvReward, EnvStart, Transcript
from toolgrpo.envs.registry import EnvRouter, register_env
from toolgrpo.envs.tool_env import ToolEnv
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.generator import Completion, SamplingParams
from toolgrpo.rollout.multi_turn import EpisodeLimits, play_task, play_tasks
from toolgrpo.rollout.render import render_text
from toolgrpo.rollout.rollback import (
    NegativeBudget,
    RollbackPolicy,
    SnapshotUnsupported,
    check_snapshot_support,
)
from toolgrpo.tools.schema import function_tool
from toolgrpo.tools.types import ToolCall, ToolResult
from toolgrpo.trainer.batch import collate_episodes

LIMITS = EpisodeLimits(max_prompt_length=8192, max_response_length=600)
ANSWER = "<answer>2</answer>"


def call(name: str, **args: Any) -> str:
    import json

    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


GOOD, BAD = call("div", a=4, b=2), call("div", a=4, b=0)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@dataclass
class AttemptGenerator:
    """Assistant texts by turn index (counted from the prompt), consumed in order per attempt;
    the last text of a turn repeats. Log-probs differ per backend sample, so a test can tell
    which attempt a token came from."""

    tokenizer: Any
    script: dict[int, list[str]]
    sampled: list[tuple[list[int], list[float]]] = field(default_factory=list)
    used: dict[int, int] = field(default_factory=dict)

    @property
    def eos_ids(self) -> list[int]:
        return [self.tokenizer.convert_tokens_to_ids("<|im_end|>")]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        out = []
        for i, p in enumerate(prompts):
            for _ in range(params.n):
                text = self.tokenizer.decode(p, skip_special_tokens=False)
                turn = text.count("<|im_start|>assistant") - 1
                texts = self.script[min(turn, max(self.script))]
                k = self.used.get(turn, 0)
                self.used[turn] = k + 1
                ids = self.tokenizer(texts[min(k, len(texts) - 1)], add_special_tokens=False)
                ids = list(ids["input_ids"]) + self.eos_ids
                lps = [-0.001 * (len(self.sampled) + 1) * (j + 1) for j in range(len(ids))]
                self.sampled.append((ids, lps))
                out.append(Completion(i, list(p), ids, lps, "stop"))
        return out


def div(a: int, b: int) -> float:
    """Divide two integers.

    Args:
        a: numerator
        b: denominator
    """
    return a / b


def div_env(max_turns: int = 4) -> ToolEnv:
    def reward(t: Transcript) -> float:
        return float(ANSWER in t.messages[-1]["content"])

    msgs = [{"role": "user", "content": "what is 4/2?"}]
    return ToolEnv(msgs, [function_tool(div)], reward, max_turns=max_turns, stateless=True)


TASK = Task("t0", ({"role": "user", "content": "x"},), "2", "test", "div")


DEFAULT = RollbackPolicy()


def play(tok, script, env, policy=DEFAULT, budget=None):
    gen = AttemptGenerator(tok, script)
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    ep = asyncio.run(play_task(TASK, env, batcher, tok, LIMITS, "u", 0, 0, policy, budget))
    batcher.close()
    return ep, gen


def ones(ep_ids: list[int], mask: list[int]) -> list[list[int]]:
    """Runs of mask-1 tokens."""
    runs, cur = [], []
    for t, m in zip(ep_ids, mask, strict=True):
        if m:
            cur.append(t)
        elif cur:
            runs, cur = [*runs, cur], []
    return [*runs, cur] if cur else runs


# ---- rollback, retry, recovery -----------------------------------------------------------------


def test_failing_call_is_rolled_back_and_retried_to_recovery(tok):
    ep, gen = play(tok, {0: [BAD, GOOD], 1: [ANSWER]}, div_env())
    assert ep.reward == 1.0 and ep.stop_reason == "answer" and ep.num_turns == 2
    r = ep.rollback
    assert (r.rollbacks, r.retries, r.recovered) == (1, 1, 1)
    assert (ep.tool_calls, ep.tool_errors) == (2, 1)  # every attempt the policy made
    assert (r.discarded_calls, r.discarded_errors) == (1, 1)
    text = tok.decode(ep.response_ids, skip_special_tokens=False)
    assert "ZeroDivisionError" not in text and "2.0" in text and '"b": 0' not in text
    assert [m["role"] for m in ep.messages] == ["system", "user", "assistant", "tool", "assistant"]
    # The rewound stream still extends exactly: tokens decode to the conversation's rendering.
    assert ep.prefix_mismatches == 0
    full = tok.decode(ep.prompt_ids + ep.response_ids, skip_special_tokens=False)
    assert full == render_text(tok, ep.messages, None, False).rstrip("\n")
    # What stands as mask 1 is exactly the kept samples (attempts 2 and 3), with their log-probs.
    kept = [gen.sampled[1], gen.sampled[2]]
    assert ones(ep.response_ids, ep.response_mask) == [ids for ids, _ in kept]
    assert ones(ep.logprobs, ep.response_mask) == [lps for _, lps in kept]
    (neg,) = ep.negatives
    assert neg.tool_position == "turn_1" and neg.error_types == ["exception"]
    assert "ZeroDivisionError" in neg.error_messages[0] and neg.attempt == 0
    (c,) = neg.tool_calls
    assert (c.name, c.arguments, c.id) == ("div", {"a": 4, "b": 0}, "call_0")


def test_all_retries_fail_and_the_last_failure_stands(tok):
    policy = RollbackPolicy(max_retries=2, max_negatives_per_group=5)
    ep, gen = play(tok, {0: [BAD], 1: [ANSWER]}, div_env(), policy)
    assert len(gen.sampled) == 4  # three attempts at turn 1, then the answer
    r = ep.rollback
    assert (r.rollbacks, r.retries, r.recovered) == (1, 2, 0)
    assert [n.attempt for n in ep.negatives] == [0, 1]
    text = tok.decode(ep.response_ids, skip_special_tokens=False)
    assert text.count("ZeroDivisionError") == 1 and ep.num_turns == 2
    assert ep.tool_errors == 3 and r.discarded_errors == 2


class ScriptedEnv(Env):
    """Replies to each step with the next scripted results; ``fatal`` marks the step at which
    the environment itself dies (as a remote server would)."""

    supports_snapshot = True
    max_turns = 4

    def __init__(self, replies: list[list[ToolResult]], fatal: int | None = None) -> None:
        self.replies, self.fatal, self.steps = list(replies), fatal, 0

    async def reset(self) -> EnvStart:
        return EnvStart([{"role": "user", "content": "go"}], [])

    async def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        self.steps += 1
        if self.steps == self.fatal:
            self.fatal_error = "server gone"
        return self.replies.pop(0)

    async def reward(self, transcript: Transcript) -> EnvReward:
        return EnvReward(0.0)

    def snapshot(self) -> None:
        return None

    def restore(self, state: Any) -> None:
        pass


BOOM = [ToolResult("boom", True, "exception", "div")]


@pytest.mark.parametrize(
    ("retry", "replies", "fatal", "recovered"),
    [
        (GOOD, [BOOM, [ToolResult("2.0", name="div")]], None, 1),
        (ANSWER, [BOOM], None, 0),  # the retry ran no tool at all
        (GOOD, [BOOM, [ToolResult("slow", True, "timeout", "div")]], None, 0),  # not rolled back
        (GOOD, [BOOM, [ToolResult("gone", True, "transport", "div")]], 2, 0),  # env_error
        (
            GOOD,
            [BOOM, [ToolResult("2.0", name="div"), ToolResult("late", True, "timeout")]],
            None,
            0,
        ),
    ],
    ids=["succeeded", "no_tool_call", "timeout", "env_error", "one_timed_out"],
)
def test_recovered_means_the_retry_ran_tools_that_succeeded(tok, retry, replies, fatal, recovered):
    """Pins issue #14 item 8: a retry counted as recovered whenever it did not match the
    rollback rule, even one that called no tool or ended with the environment failing."""
    from toolgrpo.trainer.episode_metrics import rollback_metrics

    ep, _ = play(tok, {0: [BAD, retry], 1: [ANSWER]}, ScriptedEnv(replies, fatal))
    assert (ep.rollback.rollbacks, ep.rollback.retries) == (1, 1)
    assert ep.rollback.recovered == recovered
    assert rollback_metrics([ep])["rollout/retry_success_rate"] == float(recovered)


def test_no_rollback_without_a_policy_or_a_failure(tok):
    ep, gen = play(tok, {0: [BAD], 1: [ANSWER]}, div_env(), policy=None)
    assert ep.rollback.retries == 0 and not ep.negatives and len(gen.sampled) == 2
    ep, gen = play(tok, {0: [GOOD], 1: [ANSWER]}, div_env())
    assert ep.rollback.retries == 0 and not ep.negatives and len(gen.sampled) == 2


def test_negative_masks_and_logprobs_line_up_with_the_sampled_tokens(tok):
    # Turn 1 is fine, turn 2 fails once: the negative is prefix + failing turn, no tool output.
    ep, gen = play(tok, {0: [GOOD], 1: [BAD, GOOD], 2: [ANSWER]}, div_env())
    (neg,) = ep.negatives
    assert neg.tool_position == "turn_2" and neg.assistant_turns == 2 and neg.user_turns == 1
    bad_ids, bad_lps = gen.sampled[1]
    n = len(neg.response_ids) - len(bad_ids)
    assert neg.prompt_ids == ep.prompt_ids and neg.uid == ep.uid
    assert neg.response_ids[:n] == ep.response_ids[:n]  # the shared prefix, verbatim
    assert neg.response_ids[n:] == bad_ids
    assert neg.response_mask == [0] * n + [1] * len(bad_ids)
    assert neg.logprobs == [0.0] * n + bad_lps
    assert len(neg.response_ids) == len(neg.response_mask) == len(neg.logprobs)
    decoded = tok.decode(neg.response_ids[n:], skip_special_tokens=False)
    assert '"b": 0' in decoded and decoded.endswith("<|im_end|>")
    assert "ZeroDivisionError" not in tok.decode(neg.response_ids, skip_special_tokens=False)


# ---- group cap ---------------------------------------------------------------------------------


@register_env("test_div")
def _make_div(task, options):
    return div_env(**options)


def test_cap_is_per_group_over_all_its_episodes_and_past_it_failures_stand(tok):
    gen = AttemptGenerator(tok, {0: [BAD], 1: [ANSWER]})
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    router = EnvRouter({"div": {"type": "test_div", "max_turns": 4}})
    tasks = [TASK, Task("t1", TASK.messages, "2", "test", "div")]
    policy = RollbackPolicy(max_retries=2, max_negatives_per_group=1)
    eps = asyncio.run(play_tasks(tasks, 8, router, batcher, tok, LIMITS, rollback=policy))
    batcher.close()
    batch = collate_episodes(eps, tok.pad_token_id, with_negatives=True)
    for uid in {e.uid for e in eps}:
        group = [e for e in eps if e.uid == uid]
        members = [i for i, u in enumerate(batch.uids) if u == uid]
        assert len(members) == 9  # G = 8 plus the one negative the cap allows
        assert sum(batch.is_negative[i] for i in members) == 1
        # The budget is spent after one failure: the other failures are not rolled back (none
        # is erased); they stand in their episodes, trained under the episodes' own rewards.
        assert sorted(e.rollback.retries for e in group) == [0] * 7 + [1]
        assert sum(e.rollback.capped for e in group) == 8 and not any(
            e.rollback.erased for e in group
        )
        assert sum(e.rollback.failed for e in group) == 9
        for e in group:
            text = tok.decode(ones_flat(e), skip_special_tokens=False)
            assert '"b": 0' in text  # the standing failure is trained in the episode


def ones_flat(ep) -> list[int]:
    return [t for t, m in zip(ep.response_ids, ep.response_mask, strict=True) if m]


def test_negative_budget():
    b = NegativeBudget(2)
    assert [b.take() for _ in range(4)] == [True, True, False, False]
    assert not NegativeBudget(0).take()
    assert all(NegativeBudget(None).take() for _ in range(100))  # no cap


# ---- stateful environments ---------------------------------------------------------------------


class FilesEnv(Env):
    """A tiny file system whose ``mv`` writes the destination before it checks the source: a
    failed call leaves the state changed, as a careless simulator would."""

    supports_snapshot = True

    def __init__(self) -> None:
        self.max_turns = 4
        self.files: dict[str, str] = {"a": "x"}
        self.before_step: list[dict[str, str]] = []
        self.after_restore: list[dict[str, str]] = []

    async def reset(self) -> EnvStart:
        return EnvStart([{"role": "user", "content": "move a to b"}], [])

    async def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        self.before_step.append(dict(self.files))
        out = []
        for c in calls:
            src, dst = c.arguments["src"], c.arguments["dst"]
            self.files[dst] = self.files.get(src, "")
            if src not in self.files:
                out.append(ToolResult(f"Error: no file {src}", True, "exception", c.name, c.id))
            else:
                del self.files[src]
                out.append(ToolResult("ok", name=c.name, call_id=c.id))
        return out

    async def reward(self, transcript: Transcript) -> EnvReward:
        return EnvReward(float(self.files == {"b": "x"}))

    def snapshot(self) -> dict[str, str]:
        return copy.deepcopy(self.files)

    def restore(self, state: dict[str, str]) -> None:
        self.files = copy.deepcopy(state)
        self.after_restore.append(dict(self.files))


def test_stateful_environment_is_restored_to_before_the_failed_call(tok):
    env = FilesEnv()
    script = {0: [call("mv", src="zzz", dst="b"), call("mv", src="a", dst="b")], 1: [ANSWER]}
    ep, _ = play(tok, script, env)
    assert env.before_step[0] == {"a": "x"}
    assert env.after_restore == [env.before_step[0]]  # the failed call's "b" is gone
    assert env.files == {"b": "x"} and ep.reward == 1.0


def test_bfcl_file_system_is_restored(tok):
    pytest.importorskip("bfcl_eval")
    from toolgrpo.envs._bfcl_data import entry_by_id, entry_to_task
    from toolgrpo.envs.bfcl import BfclEnv

    task = entry_to_task(entry_by_id("multi_turn_base_0"), "test")
    env = BfclEnv(task)
    env.max_turns = 3
    # A turn that creates a file and then cds into a missing folder: rolled back as a whole.
    bad = call("touch", file_name="new.txt") + "\n" + call("cd", folder="no_such_folder")
    script = {0: [bad, call("ls")], 1: [ANSWER]}
    gen = AttemptGenerator(tok, script)
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    limits = EpisodeLimits(max_prompt_length=40_000, max_response_length=600)
    ep = asyncio.run(play_task(task, env, batcher, tok, limits, "u", 0, 0, RollbackPolicy()))
    batcher.close()
    assert ep.rollback.rollbacks == 1 and ep.rollback.recovered == 1
    neg = ep.negatives[0]
    assert neg.error_types == ["json_error"] and "no_such_folder" in neg.error_messages[0]
    fresh = BfclEnv(task)
    asyncio.run(fresh.reset())
    ls = ToolCall("ls", {}, id="c")
    assert asyncio.run(env.step([ls]))[0].text == asyncio.run(fresh.step([ls]))[0].text
    assert "new.txt" not in asyncio.run(env.step([ls]))[0].text


# ---- environments that cannot snapshot ---------------------------------------------------------


class PlainEnv(Env):
    max_turns = 4

    async def reset(self) -> EnvStart:
        return EnvStart([{"role": "user", "content": "hi"}], [])

    async def step(self, calls):
        return []

    async def reward(self, transcript):
        return EnvReward(0.0)


class LateEnv(PlainEnv):
    snapshot_known_at_reset = True  # like a remote environment: decides at reset (here: no)


register_env("test_plain")(lambda task, options: PlainEnv())
register_env("test_late")(lambda task, options: LateEnv())


def test_startup_check_names_the_environment():
    router = EnvRouter({"plain": {"type": "test_plain"}, "div": {"type": "test_div"}})
    plain = Task("p", TASK.messages, "", "test", "plain")
    with pytest.raises(SnapshotUnsupported, match="task type 'plain'.*'test_plain' \\(PlainEnv\\)"):
        check_snapshot_support(router, [TASK, plain])
    check_snapshot_support(router, [TASK])  # a stateless ToolEnv snapshots for free
    check_snapshot_support(EnvRouter(), [Task("r", TASK.messages, "", "test", "rlla")])


def test_environment_that_learns_at_reset_fails_at_its_first_episode(tok):
    router = EnvRouter({"late": {"type": "test_late"}})
    late = Task("l", TASK.messages, "", "test", "late")
    check_snapshot_support(router, [late])  # cannot know yet
    gen = AttemptGenerator(tok, {0: [ANSWER]})
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    with pytest.raises(SnapshotUnsupported, match="task type 'late'.*LateEnv"):
        asyncio.run(play_tasks([late], 2, router, batcher, tok, LIMITS, rollback=RollbackPolicy()))
    batcher.close()
