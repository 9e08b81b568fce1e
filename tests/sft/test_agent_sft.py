"""Agent SFT data (issue 16 item 3): gold episodes played in the real environments, only from
train splits, rendered exactly as the episode loop renders them, trained on assistant turns."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import write_jsonl
from toolgrpo.data.loader import DataError, embedded_path, load_tasks
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.models.loading import load_tokenizer
from toolgrpo.rollout.hf import stop_token_ids
from toolgrpo.rollout.render import encode, render_text, with_tools
from toolgrpo.sft.agent import GoldCall, GoldError, play_gold
from toolgrpo.sft.config import SFTConfig
from toolgrpo.sft.data import build_examples, tokenize_conversation
from toolgrpo.sft.trainer import SFTTrainer
from toolgrpo.tools.parser import parse_tool_calls

ROOT = Path(__file__).resolve().parents[2]
ROWS = [json.loads(x) for x in embedded_path("agent_sft.jsonl", "envs").read_text().splitlines()]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def _test_rows(env):
    path = embedded_path(f"{env}_test.jsonl", "envs")
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_no_test_prompt_or_answer_leaks():
    """Every row comes from a train task: its question is a train question, its final answer
    that task's gold answer, and no test question appears anywhere in the data."""
    train = {}
    for env in ("calculator", "search", "direct"):
        for t in load_tasks([f"{env}:train"]).tasks:
            train[t.task_id] = t
    text = embedded_path("agent_sft.jsonl", "envs").read_text()
    for env in ("calculator", "search", "direct"):
        for r in _test_rows(env):
            assert json.dumps(r["prompt"][0]["content"], ensure_ascii=False)[1:-1] not in text
    for row in ROWS:
        task = train[row["meta"]["task_id"]]
        users = [m["content"] for m in row["messages"] if m["role"] == "user"]
        assert users == [task.messages[-1]["content"]]
        final = row["messages"][-1]
        assert final["role"] == "assistant" and final["content"].startswith("<answer>")


def test_rows_cover_every_train_task_plain_and_routed():
    seen = {(r["meta"]["task_id"], r["meta"]["route"]) for r in ROWS}
    assert len(ROWS) == len(seen) == 2400
    routes = {r["meta"]["task_type"]: set() for r in ROWS}
    for r in ROWS:
        routes[r["meta"]["task_type"]].add(r["meta"]["route"])
    assert routes == {
        "calculator": {"", "CALCULATE"},
        "search": {"", "SEARCH"},
        "direct": {"", "ANSWER"},
    }
    for r in ROWS:
        calls = [
            c
            for m in r["messages"]
            if m["role"] == "assistant"
            for c in parse_tool_calls(m["content"])
        ]
        if r["meta"]["task_type"] == "direct":
            assert not calls and not r["tools"]  # ANSWER: no tool, none offered
        else:
            assert calls and all(not c.parse_error for c in calls)
            assert {c.name for c in calls} <= {t["function"]["name"] for t in r["tools"]}
        if r["meta"]["route"]:
            assert r["meta"]["route"].lower()[:4] in r["messages"][0]["content"].lower() or (
                "No tools are available" in r["messages"][0]["content"]
            )


def test_gold_episodes_replay_to_full_reward_in_the_real_envs():
    """A row replayed in a fresh environment gets the same tool results and full marks."""
    by_id = {}
    for env in ("calculator", "search", "direct"):
        by_id.update({t.task_id: t for t in load_tasks([f"{env}:train"]).tasks})
    for row in ROWS[::97]:
        task = by_id[row["meta"]["task_id"]]
        turns = [
            [GoldCall(c.name, c.arguments) for c in parse_tool_calls(m["content"])]
            for m in row["messages"][:-1]
            if m["role"] == "assistant"
        ]
        answer = row["messages"][-1]["content"][len("<answer>") : -len("</answer>")]
        from toolgrpo.router.infer import conditioner

        cond = conditioner(row["meta"]["route"]) if row["meta"]["route"] else None
        ep = asyncio.run(play_gold(EnvRouter().make(task), turns, answer, cond))
        assert ep.messages == row["messages"] and ep.tools == row["tools"] and ep.reward == 1.0


def test_play_gold_refuses_a_wrong_answer_and_a_failing_call():
    task = load_tasks(["calculator:train"]).tasks[0]
    call = [[GoldCall("calculate", {"expression": "2 * (644 + 413) * 45"})]]
    with pytest.raises(GoldError, match="reward"):
        asyncio.run(play_gold(EnvRouter().make(task), call, "1"))
    with pytest.raises(GoldError, match="turn 0"):
        bad = [[GoldCall("calculate", {"expression": "1 / 0"})]]
        asyncio.run(play_gold(EnvRouter().make(task), bad, task.ground_truth))


def test_rows_tokenize_as_the_episode_loop_renders_them(tok):
    """Pins: SFT message rows ignored ``tools`` and could not carry an episode's tool specs.
    The ids are the loop's prompt then its turns; the mask covers the assistant turns (tool
    calls and final answer) and never a tool result."""
    end_ids = set(stop_token_ids(tok))
    for row in (ROWS[0], ROWS[800 + 150], ROWS[-1]):  # calculator, search, direct
        ids, mask = tokenize_conversation(tok, row["messages"], end_ids, row["tools"])
        msgs, spec = with_tools(tok, row["messages"][:2], row["tools"])
        prompt = encode(tok, render_text(tok, msgs, spec, True))
        assert ids[: len(prompt)] == prompt and not any(mask[: len(prompt)])
        full_msgs, _ = with_tools(tok, row["messages"], row["tools"])
        assert ids == encode(tok, render_text(tok, full_msgs, spec, False))
        trained = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
        want = "".join(
            m["content"] + "<|im_end|>" for m in row["messages"] if m["role"] == "assistant"
        )
        assert trained == want  # the tool turns (and every template marker) stay masked


def test_agent_sft_loads_by_embedded_name(tok):
    end_ids = set(stop_token_ids(tok))
    ex, dropped = build_examples(tok, ["agent:sft"], "ground_truth", 4096, end_ids, 5)
    assert len(ex) == 5 and dropped == 0 and ex[0].source == "agent:sft#0"


def test_sft_refuses_an_env_test_question(tok, tmp_path):
    q = _test_rows("search")[0]["prompt"][0]["content"]
    row = {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": "x"}]}
    path = write_jsonl(tmp_path / "leak.jsonl", [row])
    with pytest.raises(DataError, match="held-out calculator/search/direct"):
        build_examples(tok, [str(path)], "ground_truth", 4096, set(stop_token_ids(tok)))


def test_generator_reproduces_the_shipped_agent_data(tmp_path):
    """The seeded script rebuilds the shipped rows byte for byte (the first 40 tasks of each
    type here, to keep the test short; the full run is the same loop)."""
    out = tmp_path / "agent_sft.jsonl"
    script = str(ROOT / "scripts" / "make_agent_sft.py")
    subprocess.run(
        [sys.executable, script, "--out", str(out), "--limit", "40"],
        check=True,
        timeout=600,
        capture_output=True,
    )
    lines = embedded_path("agent_sft.jsonl", "envs").read_text(encoding="utf-8").splitlines()
    want = [
        x for x, r in zip(lines, ROWS, strict=True) if int(r["meta"]["task_id"].split("#")[1]) < 40
    ]
    assert out.read_text(encoding="utf-8").splitlines() == want and len(want) == 240


def test_one_sft_step_on_agent_rows(tiny_model_dir, tmp_path):
    """The shipped agent config's data path trains (1 step, tiny model)."""
    from toolgrpo.config.loader import load_config

    cfg = load_config(
        SFTConfig,
        str(ROOT / "configs" / "sft_smollm2_agent.yaml"),
        [
            f"model.path={tiny_model_dir}",
            "model.dtype=float32",
            "data.max_samples=4",
            "data.train_batch_size=2",
            "data.micro_batch_size_per_gpu=2",
            "trainer.total_training_steps=1",
            "trainer.logger=[jsonl]",
            f"trainer.output_dir={tmp_path / 'sft'}",
        ],
    )
    result = SFTTrainer(cfg).fit()
    assert result["steps"] == 1 and result["examples"] == 4


class ScriptedGenerator:
    """Plays the assistant turns of agent SFT rows: the turn after as many assistant turns as the
    prompt already holds, for the row whose question the prompt asks."""

    def __init__(self, tok, rows):
        self.tok, self.eos_ids = tok, list(stop_token_ids(tok))
        self.turns = {
            next(m["content"] for m in r["messages"] if m["role"] == "user"): [
                m["content"] for m in r["messages"] if m["role"] == "assistant"
            ]
            for r in rows
        }

    def generate(self, prompts, params):
        from toolgrpo.rollout.generator import Completion

        out = []
        for i, ids in enumerate(prompts):
            text = self.tok.decode(ids, skip_special_tokens=False)
            turns = next(t for q, t in self.turns.items() if q in text)
            done = text.count("<|im_start|>assistant") - 1
            new = encode(self.tok, turns[done] + "<|im_end|>")
            out.extend(Completion(i, ids, new, [0.0] * len(new), "stop") for _ in range(params.n))
        return out


def test_gold_rows_replayed_by_the_episode_loop_match_sft_tokens_and_score_full(
    tok, tiny_model_dir, tmp_path
):
    """The SFT rows are the episodes the loop itself produces: replaying their assistant turns
    through the trainer's runner gives the SFT token ids and loss mask exactly, and the eval
    summary scores them accurate, with the tool calls counted and no tool error."""
    from tests.conftest import train_overrides
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig
    from toolgrpo.eval.episodes import summarize_episodes
    from toolgrpo.eval.multi_turn import play_validation
    from toolgrpo.rewards.types import RllaFlags
    from toolgrpo.trainer.episodes import EpisodeRunner, make_router

    plain = [r for r in ROWS if not r["meta"]["route"]]
    two_hop = [r for r in plain if r["meta"]["tool_turns"] == 2][:2]
    rows = [*plain[:3], *[r for r in plain if r["meta"]["task_type"] == "search"][:3], *two_hop]
    rows += [r for r in plain if r["meta"]["task_type"] == "direct"][:3]
    by_id = {}
    for env in ("calculator", "search", "direct"):
        by_id.update({t.task_id: t for t in load_tasks([f"{env}:train"]).tasks})
    tasks = [by_id[r["meta"]["task_id"]] for r in rows]
    extra = {
        "data.max_response_length": 2048,
        "actor_rollout_ref.rollout.multi_turn.enable": "true",
        "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn": 512,
        "actor_rollout_ref.rollout.multi_turn.max_tool_response_length": 0,
    }
    cfg = load_config(TrainConfig, None, train_overrides(tiny_model_dir, "x", tmp_path, 1, **extra))
    runner = EpisodeRunner(cfg, ScriptedGenerator(tok, rows), tok, make_router(cfg, RllaFlags()))
    eps = play_validation(runner, cfg, tasks, 0, 0)
    end_ids = set(stop_token_ids(tok))
    for ep, row in zip(eps, rows, strict=True):
        ids, mask = tokenize_conversation(tok, row["messages"], end_ids, row["tools"])
        n = len(ep.prompt_ids) + len(ep.response_ids)
        assert ep.prompt_ids + ep.response_ids == ids[:n], row["meta"]
        assert ep.response_mask == mask[len(ep.prompt_ids) : n] and ep.prefix_mismatches == 0
        assert len(ids) - n <= 1 and not any(mask[n:])  # the template's newline after the end
        assert ep.reward == 1.0 and ep.stop_reason == "answer"
    s = summarize_episodes(eps)
    assert s["all"]["accuracy"] == 1.0 and s["all"]["tool_error_rate"] == 0.0
    assert s["calculator"]["tool_call_rate"] == 1.0 and s["calculator"]["calls_per_episode"] == 1
    assert s["search"]["calls_per_episode"] == 7 / 5  # three 1-hop, two 2-hop episodes
    assert s["direct"]["tool_call_rate"] == 0.0 and s["direct"]["turns_mean"] == 1


def test_routed_rows_open_as_the_trainers_route_condition_opens_them():
    """The route prompts the LM learns from are the ones the router conditions episodes with
    during training (families over the mixed train set, ``RouteCondition``)."""
    from toolgrpo.router.catalog import build_families
    from toolgrpo.router.runtime import RouteCondition

    envs = EnvRouter()
    tasks = {}
    for env in ("calculator", "search", "direct"):
        tasks.update({t.task_id: t for t in load_tasks([f"{env}:train"]).tasks})
    families = build_families(list(tasks.values()), envs)
    routed = [r for r in ROWS if r["meta"]["route"]]
    for row in routed[::150]:
        start = asyncio.run(envs.make(tasks[row["meta"]["task_id"]]).reset())
        start = RouteCondition(row["meta"]["route"], families)(start)
        opening = row["messages"][: len(start.messages)]
        assert (opening, row["tools"]) == (start.messages, start.tools), row["meta"]


def test_provenance_records_the_episode_eval(tmp_path):
    """The agent warm start's PROVENANCE.json carries its per-type env eval and its command."""
    from toolgrpo.eval.episodes import summarize_episodes
    from toolgrpo.rollout.episode import Episode

    ep = Episode("calculator#0", "calculator", "u", [1], reward=1.0, tool_calls=1)
    (tmp_path / "eval_env_test.json").write_text(json.dumps({"summary": summarize_episodes([ep])}))
    sft = {"base_model": "b", "examples": 3, "dropped_too_long": 0, "data_hash": "h"}
    sft.update({"steps": 1, "final_loss": 0.5})
    (tmp_path / "sft_result.json").write_text(json.dumps(sft))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"train/loss": 0.9}) + "\n")
    (tmp_path / "config.yaml").write_text("data: {}\n")
    script = str(ROOT / "scripts" / "provenance.py")
    got = subprocess.run(
        [sys.executable, script, str(tmp_path), "--command", "c", "--data", "agent:sft"],
        check=True,
        capture_output=True,
        text=True,
    )
    rec = json.loads(got.stdout)
    assert rec["command"] == "c" and rec["data"] == "agent:sft"
    assert rec["eval_env_test"]["calculator"]["accuracy"] == 1.0
    assert rec["eval_env_test"]["calculator"]["tool_call_rate"] == 1.0
