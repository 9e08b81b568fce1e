"""Rollout dumps (``trainer.rollout_data_dir``, issue #20 item 1): before it, a trajectory could
only be read by writing code; these tests fail on main, where the key does not exist."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import train_overrides
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.rollback import NegativeSample
from toolgrpo.safe_io import LinkRefused
from toolgrpo.trainer.rollout_dump import RolloutDumper, bound, episode_records, mask_spans
from toolgrpo.trainer.trainer import Trainer


class CharTok:
    """Token i decodes to chr(ord('a') + i): spans can be checked by eye."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(ord("a") + i) for i in ids)


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_mask_spans_split_trained_from_masked_tokens():
    spans = mask_spans(CharTok(), [0, 1, 2, 3, 4], [1, 1, 0, 0, 1])
    assert spans == [
        {"text": "ab", "trained": True, "tokens": 2},
        {"text": "cd", "trained": False, "tokens": 2},
        {"text": "e", "trained": True, "tokens": 1},
    ]


def test_episode_rows_carry_tools_reward_route_and_negatives():
    ep = Episode("t1", "calculator", "g1", [0], [1, 2, 3], [1, 0, 1], [-0.1, 0.0, -0.2])
    ep.messages = [
        {"role": "user", "content": "1+1"},
        {"role": "assistant", "content": "<tool_call>...</tool_call>"},
        {"role": "tool", "name": "calc", "content": "2"},
        {"role": "assistant", "content": "2"},
    ]
    ep.reward, ep.reward_parts, ep.stop_reason = 1.0, {"correct": 1.0}, "answer"
    neg = NegativeSample(
        "t1", "calculator", "g1", [0], [1, 4], [0, 1], [0.0, -1.0], ["Error: x"], ["exception"],
        "turn_1", 1, 1, [], 0,
    )  # fmt: skip
    ep.negatives = [neg]
    rows = episode_records(ep, CharTok(), "fixed", "CALCULATE")
    assert [r["negative"] for r in rows] == [False, True]
    main, negative = rows
    assert main["tool_calls"] == [{"turn": 1, "name": "calc", "result": "2"}]
    assert main["route"] == "CALCULATE" and main["policy"] == "fixed"
    assert main["reward"] == 1.0 and main["reward_parts"] == {"correct": 1.0}
    assert [s["trained"] for s in main["spans"]] == [True, False, True]
    assert negative["errors"] == ["Error: x"] and negative["spans"][-1]["text"] == "e"


def test_fission_continuations_are_dumped_as_their_own_group():
    ep = Episode("t1", "calculator", "g1", [0], [1, 2], [1, 1], [-0.1, -0.2])
    ep.messages = [{"role": "user", "content": "1+1"}]
    forks = [Episode("t1", "calculator", "f1", [0, 5], [3], [1], [-0.3]) for _ in range(2)]
    for f in forks:
        f.fork_of, f.reward = "g1", 1.0
    ep.forks = forks
    rows = episode_records(ep, CharTok())
    assert [(r["uid"], r["fork_of"]) for r in rows] == [("g1", None), ("f1", "g1"), ("f1", "g1")]
    assert all(not r["negative"] for r in rows) and rows[1]["reward"] == 1.0


def test_bound_keeps_whole_groups_first():
    rows = [{"uid": u, "i": i} for i, u in enumerate("aabbcc")]
    assert [r["i"] for r in bound(rows, 4)] == [0, 1, 2, 3]
    assert [r["i"] for r in bound(rows, 3)] == [0, 1, 2]
    assert len(bound(rows, -1)) == 6 and bound(rows, 0) == []


def test_dumper_replaces_a_rerun_step(tmp_path):
    d = RolloutDumper(tmp_path, limit=1)
    d.write(3, [{"uid": "a", "x": 1}, {"uid": "a", "x": 2}])
    d.write(3, [{"uid": "b", "x": 9}])
    assert [r["x"] for r in read(tmp_path / "3.jsonl")] == [9]


def test_a_planted_link_at_a_temporary_or_the_dump_is_never_written_through(tmp_path):
    """Was: a link planted at ``<dir>/1.jsonl.tmp`` had its target overwritten by the dump."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    d = tmp_path / "dumps"
    d.mkdir()
    (d / "1.jsonl.tmp").symlink_to(victim)
    RolloutDumper(d).write(1, [{"uid": "a", "x": 1}])
    assert victim.read_text() == "keep me" and [r["x"] for r in read(d / "1.jsonl")] == [1]
    (d / "2.jsonl").symlink_to(victim)
    with pytest.raises(LinkRefused, match="2.jsonl is a symbolic link"):
        RolloutDumper(d).write(2, [{"uid": "a", "x": 1}], append=True)
    assert victim.read_text() == "keep me"


def test_training_run_dumps_each_step(make_train_config, tmp_path):
    dump = tmp_path / "dump"
    cfg = make_train_config(
        steps=2,
        **{
            "actor_rollout_ref.rollout.multi_turn.enable": "true",
            "trainer.rollout_data_dir": str(dump),
            "trainer.rollout_data_samples_per_step": "3",
        },
    )
    Trainer(cfg).fit()
    for step in (1, 2):
        rows = read(dump / f"{step}.jsonl")
        assert len(rows) == 3  # 2 tasks x n=2 = 4 episodes, bounded to 3
        assert len({r["uid"] for r in rows[:2]}) == 1  # the first group whole
        for r in rows:
            assert r["step"] == step and r["task_type"] == "rlla" and r["policy"] == "actor"
            assert r["messages"][0]["role"] in ("system", "user")
            assert any(s["trained"] for s in r["spans"]) and isinstance(r["reward"], float)


def test_single_turn_run_and_eval_dump(make_train_config, tmp_path, tiny_model_dir, tiny_data):
    from toolgrpo.cli import main

    dump = tmp_path / "dump"
    Trainer(make_train_config(steps=1, **{"trainer.rollout_data_dir": str(dump)})).fit()
    rows = read(dump / "1.jsonl")
    assert len(rows) == 4 and all("correctness" in r["reward_parts"] for r in rows)
    ev = tmp_path / "evdump"
    ov = train_overrides(tiny_model_dir, tiny_data, tmp_path / "ev", 1)
    args = ["eval", "--limit", "2", "--rollout-data-dir", str(ev), *ov]
    assert main(args) == 0
    assert len(read(ev / "0.jsonl")) == 2
