"""Fission (Fission-GRPO): an episode's first failed call becomes a new prompt, from which a group
of continuations is sampled and trained as its own GRPO group beside the original episode."""

from __future__ import annotations

import asyncio
import copy
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from tests.rollout.test_rollback import ANSWER, BAD, GOOD, LIMITS, TASK, call, ones
from tests.trainer.test_negatives import config
from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env, EnvReward, EnvStart, Transcript
from toolgrpo.envs.registry import EnvRouter, register_env
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.fission import keep_trainable, select_forks
from toolgrpo.rollout.generator import Completion, SamplingParams
from toolgrpo.rollout.multi_turn import play_tasks
from toolgrpo.rollout.rollback import RollbackPolicy
from toolgrpo.tools.types import ToolCall, ToolResult
from toolgrpo.trainer.episodes import EpisodeRunner

FISSION = RollbackPolicy(mode="fission", fission_group_size=3)
KEY = "actor_rollout_ref.rollout.multi_turn."
ERROR = "ZeroDivisionError"


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@dataclass
class SeededGenerator:
    """Samples each turn's text with a seeded RNG: the first turn is a failing or a good call,
    a turn after an error a good or a failing call again, any other turn the answer. The k-th
    sample of a prompt draws from its own seeded stream, so the order in which episodes'
    requests reach the backend (tools run in threads) does not change what is sampled."""

    tokenizer: Any
    seed: int
    p_fail: float = 0.5
    drawn: dict[tuple[int, ...], int] = field(default_factory=dict)

    @property
    def eos_ids(self) -> list[int]:
        return [self.tokenizer.convert_tokens_to_ids("<|im_end|>")]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        out = []
        for i, p in enumerate(prompts):
            text = self.tokenizer.decode(p, skip_special_tokens=False)
            last = text.rsplit("<|im_start|>", 2)[-2]  # the message before the generation prompt
            for _ in range(params.n):
                k = self.drawn.get(tuple(p), 0)
                self.drawn[tuple(p)] = k + 1
                rng = random.Random(f"{self.seed}-{hash(tuple(p))}-{k}")
                fail = rng.random() < self.p_fail
                if text.count("<|im_start|>assistant") == 1 or ERROR in last:
                    reply = BAD if fail else GOOD
                else:
                    reply = ANSWER
                ids = list(self.tokenizer(reply, add_special_tokens=False)["input_ids"])
                ids += self.eos_ids
                lps = [round(-0.01 * rng.random(), 6) for _ in ids]
                out.append(Completion(i, list(p), ids, lps, "stop"))
        return out


def play(tok, tasks, n, policy, seed=0, router=None, limits=LIMITS) -> list[Episode]:
    batcher = GenerationBatcher(SeededGenerator(tok, seed), SamplingParams(max_new_tokens=64))
    router = router or EnvRouter({"div": {"type": "test_div", "max_turns": 4}})
    try:
        return asyncio.run(play_tasks(tasks, n, router, batcher, tok, limits, rollback=policy))
    finally:
        batcher.close()


def decoded(tok, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False)


def test_a_failed_call_forks_a_group_of_continuations_from_its_error(tok):
    eps = play(tok, [TASK], 4, FISSION, seed=3)
    forked = [e for e in eps if e.forks]
    first = [decoded(tok, ones(e.response_ids, e.response_mask)[0]) for e in eps]
    failed = [e for e, turn in zip(eps, first, strict=True) if '"b": 0' in turn]
    assert forked and forked == failed  # every episode whose first call failed, and only those
    for parent in forked:
        # The original episode is as sampled: its failure stands, trained under its reward.
        assert not parent.negatives and parent.rollback.forks == 1
        assert not parent.rollback.repaired and parent.rollback.failed >= 1
        group = parent.forks
        assert len(group) == 3 and len({c.uid for c in group}) == 1
        assert group[0].uid != parent.uid and all(c.fork_of == parent.uid for c in group)
        for c in group:
            prompt = decoded(tok, c.prompt_ids)
            # The prompt is the parent's trajectory up to the error, the error as the tool's
            # result, then the generation prompt: it ends in the error message.
            head, gen_prompt = prompt.rsplit("<|im_start|>", 1)
            assert gen_prompt == "assistant\n"
            error = next(m for m in c.messages if m["role"] == "tool")  # the first failure's
            assert head.endswith(error["content"] + "<|im_end|>\n")
            assert ERROR in error["content"] and c.meta["fork_errors"] == [error["content"]]
            assert c.prompt_ids == (parent.prompt_ids + parent.response_ids)[: len(c.prompt_ids)]
            # Only the continuation's own turns train; it scores the whole trajectory.
            assert c.response_mask[0] == 1 and c.stop_reason in ("answer", "max_turns")
            assert c.reward in (0.0, 1.0)
            spent = len(c.prompt_ids) - len(parent.prompt_ids)
            assert spent + len(c.response_ids) <= LIMITS.max_response_length


def test_the_continuation_rows_join_the_batch_under_their_own_uid(tok):
    eps = play(tok, [TASK, Task("t1", TASK.messages, "2", "test", "div")], 4, FISSION, seed=3)
    runner = EpisodeRunner(config(**{f"{KEY}rollback_mode": "fission"}), None, tok, None)
    batch, _ = runner.to_batch(eps)
    forks = [c for e in eps for c in e.forks]
    assert forks and batch.size == len(eps) + len(forks)  # no negatives under fission
    assert batch.uids[len(eps) :] == [c.uid for c in forks]
    assert not any(batch.is_negative)
    assert batch.scores_B[len(eps) :].tolist() == [c.reward for c in forks]
    assert set(batch.uids[len(eps) :]).isdisjoint(batch.uids[: len(eps)])


def test_a_fixed_seed_gives_the_same_forks(tok):
    def rows(seed):
        eps = play(tok, [TASK], 4, FISSION, seed=seed)
        return sorted((c.prompt_ids, c.response_ids, c.logprobs) for e in eps for c in e.forks)

    first = rows(3)
    assert first and rows(3) == first
    assert rows(4) != first


def test_forks_are_capped_per_step_spreading_over_tasks(tok):
    assert select_forks([None, "a", "b", None, None, "c"], 3, None) == [1, 2, 5]
    assert select_forks([None, "a", "b", None, None, "c"], 3, 2) == [1, 5]  # each task's first
    assert select_forks(["a", "b"], 2, 0) == []
    tasks = [TASK, Task("t1", TASK.messages, "2", "test", "div")]
    capped = RollbackPolicy(mode="fission", fission_group_size=2, max_forks_per_step=1)
    eps = play(tok, tasks, 4, capped, seed=3)
    assert sum(bool(e.forks) for e in eps) == 1
    assert sum(e.rollback.failed > 0 for e in eps) > 1  # more failed than forked


def test_failed_continuations_leave_the_group_and_a_lone_one_takes_it_along():
    ok = Episode("t", "x", "u", [1])
    bad = Episode("t", "x", "u", [1], env_failure="boom")
    assert keep_trainable([ok, bad, copy.copy(ok)]) == [ok, ok]
    assert keep_trainable([ok, bad]) == []


class Counter(Env):
    """A tool with state: ``inc`` adds one and says the count; ``div`` by zero fails. Each
    instance counts how it was built, so a test can tell restored state from fresh."""

    supports_snapshot = True
    max_turns = 5
    built: list[Counter] = []

    def __init__(self) -> None:
        self.count = 0
        Counter.built.append(self)

    async def reset(self) -> EnvStart:
        return EnvStart([{"role": "user", "content": "count"}], [])

    async def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        out = []
        for c in calls:
            if c.name == "inc":
                self.count += 1
                out.append(ToolResult(f"count={self.count}", name="inc", call_id=c.id))
            else:
                out.append(ToolResult(f"{ERROR}: division by zero", True, "exception", c.name))
        return out

    async def reward(self, transcript: Transcript) -> EnvReward:
        return EnvReward(float(self.count))

    def snapshot(self) -> int:
        return self.count

    def restore(self, state: Any) -> None:
        self.count = int(state)


register_env("test_counter")(lambda task, options: Counter())
INC = call("inc")


class CounterScript(SeededGenerator):
    """inc, then a failing call, then inc and the answer (the parent and every continuation)."""

    def generate(self, prompts, params):
        out = []
        for i, p in enumerate(prompts):
            turn = decoded(self.tokenizer, p).count("<|im_start|>assistant") - 1
            reply = [INC, BAD, INC, ANSWER][min(turn, 3)]
            ids = list(self.tokenizer(reply, add_special_tokens=False)["input_ids"]) + self.eos_ids
            out.extend(Completion(i, list(p), ids, [-0.1] * len(ids), "stop")
                       for _ in range(params.n))  # fmt: skip
        return out


def test_a_continuation_goes_on_from_the_state_at_its_fork(tok):
    """The parent counts to 2 after its failure; each continuation is restored to the count at
    the failure (1), so its own ``inc`` says 2 and it scores 2, not 3 (the parent's end) or 1
    (a fresh environment)."""
    router = EnvRouter({"count": {"type": "test_counter", "max_turns": 5}})
    task = Task("c0", TASK.messages, "", "test", "count")
    batcher = GenerationBatcher(CounterScript(tok, 0), SamplingParams(max_new_tokens=64))
    run = play_tasks([task], 2, router, batcher, tok, LIMITS, rollback=FISSION)
    eps = asyncio.run(run)
    batcher.close()
    for parent in eps:
        assert parent.reward == 2.0 and len(parent.forks) == 3
        for c in parent.forks:
            assert c.reward == 2.0 and "count=2" in decoded(tok, c.response_ids)
            assert c.num_turns == 4 and c.stop_reason == "answer"


def test_forks_follow_the_parents_policy_and_leave_the_parents_group_alone(tok):
    """The parents' group is exactly what no rollback trains (same rows, same advantages)."""
    eps = play(tok, [TASK], 4, FISSION, seed=3)
    plain = play(tok, [TASK], 4, None, seed=3)
    parents = [(e.prompt_ids, e.response_ids, e.response_mask) for e in eps]
    assert parents == [(e.prompt_ids, e.response_ids, e.response_mask) for e in plain]
    runner = EpisodeRunner(config(**{f"{KEY}rollback_mode": "fission"}), None, tok, None)
    batch, _ = runner.to_batch(eps)
    from toolgrpo.trainer.batch import negative_parents

    extra = negative_parents(eps)
    assert len(extra) == batch.size - len(eps) and all(eps[i].forks for i in extra)
    assert torch.equal(batch.scores_B[: len(eps)], torch.tensor([e.reward for e in plain]))


def test_the_step_metrics_count_the_continuations_apart(tok):
    from toolgrpo.trainer.episode_metrics import episode_metrics

    eps = play(tok, [TASK], 4, FISSION, seed=3)
    forks = [c for e in eps for c in e.forks]
    m = episode_metrics(eps)
    assert m["rollout/fission_rows"] == len(forks) and m["rollback/forks"] == len(forks) / 3
    assert m["reward/fission_mean"] == pytest.approx(sum(c.reward for c in forks) / len(forks))
    assert m["episode/reward/mean"] == pytest.approx(sum(e.reward for e in eps) / 4)  # episodes
    assert "rollout/fission_rows" not in episode_metrics(play(tok, [TASK], 4, None, seed=3))
