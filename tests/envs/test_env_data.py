"""The shipped calculator/search task files: they load by embedded name with the right task type,
their answers are checkable, and the generator reproduces them byte for byte."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from toolgrpo.data.loader import DataError, embedded_path, load_tasks
from toolgrpo.envs.calculator import parse_number
from toolgrpo.envs.search import normalize_answer, read_corpus
from toolgrpo.rewards.scoring import check_task

ROOT = Path(__file__).resolve().parents[2]
FILES = ("calculator_train", "calculator_test", "search_corpus", "search_train", "search_test")


def rows(name: str) -> list[dict]:
    path = embedded_path(f"{name}.jsonl", "envs")
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    "spec, size",
    [
        ("calculator:train", 400),
        ("calculator:test", 100),
        ("search:train", 400),
        ("search:test", 100),
    ],
)
def test_embedded_datasets_load_with_their_task_type(spec, size):
    data = load_tasks([spec], bad_rows="error", check=check_task)
    env = spec.split(":")[0]
    assert len(data.tasks) == size and not data.problems
    assert {(t.task_type, t.data_source) for t in data.tasks} == {(env, env)}
    assert all(t.messages[0]["role"] == "user" for t in data.tasks)  # the env adds the system
    assert len({t.task_id for t in data.tasks}) == size


def test_unknown_embedded_split_lists_the_known_ones():
    with pytest.raises(DataError, match="have search:train, search:test"):
        load_tasks(["search:dev"])


def test_train_and_test_questions_are_disjoint():
    for env in ("calculator", "search"):
        train = {r["prompt"][0]["content"] for r in rows(f"{env}_train")}
        test = {r["prompt"][0]["content"] for r in rows(f"{env}_test")}
        assert len(train) == 400 and len(test) == 100 and not train & test


def test_ground_truths_are_checkable():
    for split in ("calculator_train", "calculator_test"):
        assert all(parse_number(r["reward_model"]["ground_truth"]) is not None for r in rows(split))
    docs = {
        d.id: normalize_answer(d.text)
        for d in read_corpus(embedded_path("search_corpus.jsonl", "envs"))
    }
    for split in ("search_train", "search_test"):
        for r in rows(split):
            support = r["extra_info"]["support"]
            assert len(support) == r["extra_info"]["hops"]
            assert normalize_answer(r["reward_model"]["ground_truth"]) in docs[support[-1]]


def test_generator_reproduces_the_shipped_files(tmp_path):
    script = ROOT / "scripts" / "make_env_data.py"
    subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    for name in FILES:
        shipped = embedded_path(f"{name}.jsonl", "envs").read_bytes()
        assert (tmp_path / f"{name}.jsonl").read_bytes() == shipped, name
    total = sum(embedded_path(f"{n}.jsonl", "envs").stat().st_size for n in FILES)
    assert total < 500_000  # the data ships in the wheel
