"""The search environment: BM25 over the shipped fictional corpus (or a user's), its two tools,
and the SQuAD-style F1 reward, driven through the registry as the trainer does."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.conftest import write_jsonl
from toolgrpo.data.loader import embedded_path
from toolgrpo.data.task import Task
from toolgrpo.envs.base import Transcript
from toolgrpo.envs.registry import EnvConfigError, EnvRouter
from toolgrpo.envs.search import (
    SYSTEM_PROMPT,
    Document,
    SearchIndex,
    f1_score,
    load_index,
    normalize_answer,
    read_corpus,
    search_reward,
    split_passages,
)
from toolgrpo.tools.types import ToolCall

# Measured on the shipped test split, querying with the whole question: one-hop questions 1.00
# (67), the first document of two-hop ones 1.00 (33), while their answer is in the top 3 for only
# 0.30 of them: the second hop needs a second search.
RECALL_ONE_HOP = 0.95
RECALL_FIRST_HOP = 0.9


def shipped(split: str) -> list[dict]:
    path = embedded_path(f"search_{split}.jsonl", "envs")
    return [json.loads(line) for line in path.read_text().splitlines()]


def recall_at_3(rows: list[dict]) -> tuple[float, float]:
    """(share with the first supporting document in the top 3, share with the answer in them)."""
    index = load_index()
    doc_hits = answer_hits = 0
    for r in rows:
        hits = [p for p, _ in index.search(r["prompt"][0]["content"], 3)]
        doc_hits += r["extra_info"]["support"][0] in {p.doc_id for p in hits}
        answer = normalize_answer(r["reward_model"]["ground_truth"])
        answer_hits += any(answer in normalize_answer(p.text) for p in hits)
    return doc_hits / len(rows), answer_hits / len(rows)


def test_recall_at_3_on_the_test_split():
    rows = shipped("test")
    one = [r for r in rows if r["extra_info"]["hops"] == 1]
    two = [r for r in rows if r["extra_info"]["hops"] == 2]
    assert len(one) >= 50 and len(two) >= 20
    doc_recall, answer_recall = recall_at_3(one)
    assert doc_recall >= RECALL_ONE_HOP and answer_recall >= RECALL_ONE_HOP
    first_doc_recall, answer_recall = recall_at_3(two)
    assert first_doc_recall >= RECALL_FIRST_HOP and answer_recall <= 0.5


def test_index_is_built_once_per_process():
    assert load_index() is load_index()
    assert len(load_index().docs) >= 200


def test_split_passages_keeps_every_sentence():
    text = " ".join(f"Sentence {i} has five words." for i in range(30))
    passages = split_passages(Document("d", "T", text), max_words=20)
    assert len(passages) == 8 and all(len(p.text.split()) <= 20 for p in passages)
    assert " ".join(p.text for p in passages) == text


def test_read_corpus_refuses_bad_rows(tmp_path):
    dup = write_jsonl(tmp_path / "dup.jsonl", [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}])
    with pytest.raises(EnvConfigError, match="duplicate document id 'a'"):
        read_corpus(dup)
    with pytest.raises(EnvConfigError, match="line 1"):
        read_corpus(write_jsonl(tmp_path / "bad.jsonl", [{"title": "no id or text"}]))
    with pytest.raises(EnvConfigError, match="not found"):
        read_corpus(tmp_path / "missing.jsonl")


@pytest.mark.parametrize(
    "prediction, truth, f1",
    [
        ("Lake Hesros", "Lake Hesros", 1.0),
        ("the 44,275.", "44275", 1.0),
        ("Hesros", "Lake Hesros", 2 / 3),
        ("Lake Ontario", "Lake Hesros", 0.5),
        ("1843", "1844", 0.0),
    ],
)
def test_f1(prediction, truth, f1):
    assert f1_score(prediction, truth) == pytest.approx(f1)


def test_reward_parts():
    def final(text: str) -> Transcript:
        msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}]
        return Transcript(msgs, "", "answer", 1)

    exact = search_reward(final("<answer>The Tessel River</answer>"), "Tessel River")
    assert exact.score == 1.0 and exact.parts == {"em": 1.0, "f1": 1.0, "has_answer": 1.0}
    part = search_reward(final("<answer>Tessel</answer>"), "Tessel River")
    assert part.parts["em"] == 0.0 and part.score == pytest.approx(2 / 3)
    none = search_reward(final("It is the Tessel River."), "Tessel River")
    assert none.score == 0.0 and none.parts["has_answer"] == 0.0


def call(name: str, **arguments) -> ToolCall:
    return ToolCall(name, arguments, id=f"call_{name}")


def test_env_episode_on_a_shipped_question():
    row = next(r for r in shipped("test") if r["extra_info"]["hops"] == 1)
    question, truth = row["prompt"][0]["content"], row["reward_model"]["ground_truth"]
    doc_id = row["extra_info"]["support"][0]
    task = Task("search#0", ({"role": "user", "content": question},), truth, "search", "search")

    async def episode():
        env = EnvRouter().make(task)
        start = await env.reset()
        assert start.messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
        assert {t["function"]["name"] for t in start.tools} == {"search", "open_document"}
        found, opened, missing = await env.step(
            [
                call("search", query=question),
                call("open_document", doc_id=doc_id),
                call("open_document", doc_id="nope-999"),
            ]
        )
        assert f"doc_id: {doc_id}" in found.text and found.text.startswith("[1] ")
        assert normalize_answer(truth) in normalize_answer(opened.text)
        assert missing.is_error and "no document 'nope-999'" in missing.text
        answer = {"role": "assistant", "content": f"<answer>{truth}</answer>"}
        return await env.reward(Transcript([*start.messages, answer], "", "answer", 2))

    assert asyncio.run(episode()).score == 1.0


def test_user_corpus_and_top_k_cap(tmp_path):
    docs = [
        {"id": f"d{i}", "title": f"Moon {i}", "text": f"Moon {i} orbits planet Zorb."}
        for i in range(10)
    ]
    corpus = write_jsonl(tmp_path / "corpus.jsonl", docs)
    task = Task("s#1", ({"role": "user", "content": "q"},), "Zorb", "search", "search")
    router = EnvRouter({"search": {"corpus": str(corpus), "top_k": 2, "max_top_k": 4}})

    async def run():
        env = router.make(task)
        await env.reset()
        return await env.step(
            [
                call("search", query="Zorb moon"),
                call("search", query="Zorb moon", top_k=50),
                call("search", query="unrelated words"),
                call("open_document", doc_id="Moon 3"),
            ]
        )

    default, capped, nothing, by_title = asyncio.run(run())
    assert default.text.count("doc_id:") == 2
    assert capped.text.count("doc_id:") == 4
    assert nothing.text.startswith("No passage matches")
    assert by_title.text == "doc_id: d3 | Moon 3\nMoon 3 orbits planet Zorb."
    with pytest.raises(EnvConfigError, match="unknown search option"):
        EnvRouter({"search": {"topk": 3}}).make(task)


def test_equal_scores_come_back_in_corpus_order_whatever_numpy_sorts_with(monkeypatch):
    """Ties are common in templated documents; their order was left to numpy's (CPU-dependent)
    sort, so one query returned other passages on AVX512 machines. Now: corpus order."""
    import numpy as np

    docs = [Document(f"d{i}", f"Town {i}", "A quiet town on the river Zen.") for i in range(6)]
    docs.append(Document("other", "Elsewhere", "Nothing about rivers at all here."))
    index = SearchIndex(docs)
    hits = [p.doc_id for p, _ in index.search("river Zen", 4)]
    assert hits == ["d0", "d1", "d2", "d3"]
    # An adversarial sort that reverses equal keys changes nothing.
    real = np.argsort
    monkeypatch.setattr(np, "argsort", lambda a, *x, **kw: real(a, *x, **kw)[::-1].copy())
    assert [p.doc_id for p, _ in index.search("river Zen", 4)] == hits
    assert index.search("the of and", 3) == []  # only stopwords: no query terms, no hits
