"""benchmarks/teacher_tokens.py: assistant tokens split into the final turn and the earlier ones,
and teacher-forced log-probs of a real (tiny) model scored over exactly those tokens."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import teacher_tokens as tt  # noqa: E402


def test_turns_split_into_the_final_one_and_the_earlier_ones():
    mask = [0, 0, 1, 1, 0, 0, 1, 1, 1, 0]
    assert tt.segments(mask) == [(2, 4), (6, 9)]
    parts = tt.split_turns(mask)
    assert parts["final_turn"] == [0, 0, 0, 0, 0, 0, 1, 1, 1, 0]
    assert parts["earlier_turns"] == [0, 0, 1, 1, 0, 0, 0, 0, 0, 0]
    got = tt.picks(parts)  # over the 5 log-probs of positions 2, 3, 6, 7, 8
    assert got["all"].tolist() == [True] * 5
    assert got["final_turn"].tolist() == [False, False, True, True, True]
    assert got["earlier_turns"].tolist() == [True, True, False, False, False]
    assert tt.split_turns([0, 1, 1])["earlier_turns"] == [0, 0, 0]  # one turn: no earlier ones


def test_token_stats_are_the_shaping_weights_of_the_probabilities():
    p = torch.tensor([0.5, 0.05, 0.01, 0.9])
    got = tt.token_stats([p[:2].log(), p[2:].log()], gamma=0.1)
    assert got["tokens"] == 4 and got["low_frac"] == pytest.approx(0.5)
    assert got["logp_mean"] == pytest.approx(float(p.log().mean()))
    weights = [0.1 * x / (x + 0.1) ** 2 for x in p.tolist()]
    assert got["shaping_weight_mean"] == pytest.approx(sum(weights) / 4)
    assert tt.token_stats([], 0.1)["logp_mean"] is None


def test_a_model_is_scored_on_every_assistant_token_of_the_episodes(tmp_path, tiny_model_dir):
    rows = [
        {"messages": [
            {"role": "user", "content": "What is 7*6?"},
            {"role": "assistant", "content": '<tool_call>{"name": "calc", "arguments": {}}'},
            {"role": "tool", "content": "42"},
            {"role": "assistant", "content": "<answer>42</answer>"},
        ]},
        {"messages": [
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "<answer>Paris</answer>"},
        ]},
    ]  # fmt: skip
    data = tmp_path / "teacher.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = tt.score_model(str(tiny_model_dir), data, 0.1)
    assert got["episodes"] == 2 and got["dropped"] == 0
    a, f, e = got["all"], got["final_turn"], got["earlier_turns"]
    assert a["tokens"] == f["tokens"] + e["tokens"] and e["tokens"] > 0 and f["tokens"] > 0
    pooled = (f["logp_mean"] * f["tokens"] + e["logp_mean"] * e["tokens"]) / a["tokens"]
    assert a["logp_mean"] == pytest.approx(pooled, rel=1e-5)
    assert a["logp_mean"] < 0 and math.isfinite(got["episode_logp_mean"])
    assert got["episode_logp_mean"] == pytest.approx(a["logp_mean"] * a["tokens"] / 2, rel=1e-4)


def _row(step, uid, policy, reward, tokens, negative=False):
    spans = [{"text": "x", "trained": True, "tokens": tokens}, {"text": "tool", "trained": False,
             "tokens": 99}]  # fmt: skip
    return {"step": step, "uid": uid, "policy": policy, "reward": reward, "spans": spans,
            "task_type": "calculator", "negative": negative}  # fmt: skip


def test_advantage_mass_splits_the_update_between_teacher_and_actor(tmp_path):
    dumps = tmp_path / "rollout_data"
    dumps.mkdir()
    rows = [_row(1, "g", "actor", 0.0, 10) for _ in range(4)] + [_row(1, "g", "fixed", 1.0, 5)]
    rows += [_row(1, "h", "actor", 0.0, 50) for _ in range(4)] + [_row(1, "h", "fixed", 0.0, 7)]
    (dumps / "1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 1, "mixture/shaping_grad_weight_mean": 0.1}) + "\n")
    std = math.sqrt(0.2 * 0.8 * 5 / 4)  # the unbiased std of one success in five
    teacher = (0.8 / std) * 5 * 0.1  # its advantage x its trained tokens x the shaping weight
    actor = 4 * (0.2 / std) * 10  # group h is all failures: no advantage, no mass
    got = tt.advantage_mass(dumps, metrics)
    assert got["fixed_success"] == pytest.approx(teacher / (teacher + actor), rel=1e-5)
    assert got["actor_failure"] == pytest.approx(actor / (teacher + actor), rel=1e-5)
    assert got["fixed_failure"] == 0.0
    unweighted = tt.advantage_mass(dumps)  # no metrics: fixed rows at weight 1
    assert unweighted["fixed_success"] == pytest.approx(10 * teacher / (10 * teacher + actor))
