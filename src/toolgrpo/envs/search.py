"""Question answering over a document collection that the model must search (BM25, in memory).

The shipped corpus describes fictional towns, people, companies and rivers, so answers cannot come
from pretraining. Documents are split into passages and indexed once per process (one environment
is made per episode). The reward is SQuAD-style token F1 of the final ``<answer>``.
"""

from __future__ import annotations

import json
import re
import string
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from toolgrpo.data.loader import embedded_path
from toolgrpo.data.task import Task
from toolgrpo.envs.base import EnvReward, Transcript
from toolgrpo.envs.calculator import check_options, final_answer, with_system
from toolgrpo.envs.registry import EnvConfigError, register_env
from toolgrpo.envs.tool_env import ToolEnv
from toolgrpo.tools.schema import Tool, function_tool

SYSTEM_PROMPT = (
    "You answer questions about a document collection. Do not guess: look facts up.\n"
    "To call a tool, write one block per call:\n"
    '<tool_call>{"name": "search", "arguments": {"query": "mayor of Varneth"}}</tool_call>\n'
    "Some questions need two searches: first find the bridging entity, then search for it.\n"
    "Tool results come back in the next message. When you know the answer, reply with it only, as "
    "<answer>ANSWER</answer> (a name, year or number, as short as possible)."
)

OPTIONS = ("corpus", "top_k", "max_top_k", "passage_words", "max_doc_chars", "timeout_s")


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Passage:
    doc_id: str
    title: str
    text: str


def default_corpus() -> Path:
    return embedded_path("search_corpus.jsonl", "envs")


def read_corpus(path: str | Path) -> list[Document]:
    """A JSONL of ``{"id", "title", "text"}`` objects; refuses duplicates and missing fields."""
    p = Path(path)
    if not p.is_file():
        raise EnvConfigError(f"search corpus not found: {p}")
    docs: list[Document] = []
    seen: set[str] = set()
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            doc = Document(str(row["id"]), str(row.get("title") or row["id"]), str(row["text"]))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            msg = f"{p} line {n}: want a JSON object with id, title, text ({e})"
            raise EnvConfigError(msg) from None
        if doc.id in seen:
            raise EnvConfigError(f"{p} line {n}: duplicate document id {doc.id!r}")
        seen.add(doc.id)
        docs.append(doc)
    if not docs:
        raise EnvConfigError(f"search corpus {p} has no documents")
    return docs


def split_passages(doc: Document, max_words: int) -> list[Passage]:
    """Consecutive sentences up to ``max_words`` words, so a hit shows the lines that matched."""
    chunks: list[list[str]] = [[]]
    for sentence in re.split(r"(?<=[.!?])\s+", doc.text.strip()):
        if (
            chunks[-1]
            and sum(len(s.split()) for s in chunks[-1]) + len(sentence.split()) > max_words
        ):
            chunks.append([])
        chunks[-1].append(sentence)
    return [Passage(doc.id, doc.title, " ".join(c)) for c in chunks if c]


class SearchIndex:
    """BM25 over passages (title prepended, so a name in the title counts)."""

    def __init__(self, docs: list[Document], passage_words: int = 100) -> None:
        import bm25s
        from bm25s.tokenization import Tokenizer

        self.docs = {d.id: d for d in docs}
        self._by_title = {d.title.lower(): d for d in docs}
        self.passages = [p for d in docs for p in split_passages(d, passage_words)]
        self._tokenizer = Tokenizer(stopwords="en")
        texts = [f"{p.title}. {p.text}" for p in self.passages]
        tokens = self._tokenizer.tokenize(texts, return_as="tuple", show_progress=False)
        self._bm25 = bm25s.BM25()
        self._bm25.index(tokens, show_progress=False)

    def search(self, query: str, k: int) -> list[tuple[Passage, float]]:
        """The ``k`` best passages with a positive score; equal scores in corpus order.

        Templated documents tie often (a third of the shipped search episodes meet a tie), and
        bm25s's top-k leaves ties to numpy's sort, whose order differs between CPUs (AVX512
        dispatch vs not): the same query returned different passages on different machines."""
        (ids,) = self._tokenizer.tokenize(
            [query], update_vocab=False, return_as="ids", show_progress=False
        )
        if not ids:
            return []
        scores = self._bm25.get_scores(list(ids))
        k = max(1, min(k, len(self.passages)))
        best = np.lexsort((np.arange(len(scores)), -scores))[:k]
        return [(self.passages[int(i)], float(scores[i])) for i in best if scores[i] > 0]

    def document(self, doc_id: str) -> Document | None:
        key = doc_id.strip()
        return self.docs.get(key) or self._by_title.get(key.lower())


_LOCK = threading.Lock()


@lru_cache(maxsize=4)
def _cached_index(path: str, passage_words: int) -> SearchIndex:
    return SearchIndex(read_corpus(path), passage_words)


def load_index(path: str | Path | None = None, passage_words: int = 100) -> SearchIndex:
    """The index of a corpus, built on first use and shared by every episode of the process."""
    with _LOCK:  # tools run in worker threads; build each index once
        return _cached_index(str(Path(path or default_corpus()).resolve()), passage_words)


def search_tools(
    index: SearchIndex, top_k: int = 3, max_top_k: int = 5, max_doc_chars: int = 4000
) -> tuple[Tool, ...]:
    """``search`` and ``open_document`` bound to one index."""
    default_k = min(top_k, max_top_k)

    def search(query: str, top_k: int = default_k) -> str:
        """Find passages about a topic in the document collection.

        Args:
            query: Keywords or a question, e.g. "mayor of Varneth".
            top_k: How many passages to return.
        """
        if not query.strip():
            raise ValueError("the query is empty")
        hits = index.search(query, max(1, min(int(top_k), max_top_k)))
        if not hits:
            return f"No passage matches {query!r}. Try other keywords."
        return "\n\n".join(
            f"[{n}] doc_id: {p.doc_id} | {p.title}\n{p.text}" for n, (p, _) in enumerate(hits, 1)
        )

    def open_document(doc_id: str) -> str:
        """Read a whole document, when a passage is not enough.

        Args:
            doc_id: The doc_id shown by search (a document title also works).
        """
        doc = index.document(doc_id)
        if doc is None:
            raise ValueError(f"no document {doc_id!r}; use a doc_id from the search results")
        text = doc.text if len(doc.text) <= max_doc_chars else doc.text[:max_doc_chars] + " [...]"
        return f"doc_id: {doc.id} | {doc.title}\n{text}"

    search.__doc__ = (search.__doc__ or "").replace(
        "How many passages to return.",
        f"How many passages to return ({default_k} if omitted, at most {max_top_k}).",
    )
    return function_tool(search), function_tool(open_document)


_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def f1_score(prediction: str, ground_truth: str) -> float:
    pred, gold = normalize_answer(prediction).split(), normalize_answer(ground_truth).split()
    common = sum((Counter(pred) & Counter(gold)).values())
    if not pred or not gold or common == 0:
        return float(pred == gold)
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def search_reward(transcript: Transcript, ground_truth: str) -> EnvReward:
    answer = final_answer(transcript.messages)
    if answer is None:
        return EnvReward(0.0, {"em": 0.0, "f1": 0.0, "has_answer": 0.0})
    f1 = f1_score(answer, ground_truth)
    em = float(normalize_answer(answer) == normalize_answer(ground_truth))
    return EnvReward(f1, {"em": em, "f1": f1, "has_answer": 1.0})


@lru_cache(maxsize=8)
def _tools(corpus: str | None, top_k: int, max_top_k: int, words: int, chars: int) -> tuple:
    return search_tools(load_index(corpus, words), top_k, max_top_k, chars)


@register_env("search")
def make_search_env(task: Task, options: Mapping[str, Any]) -> ToolEnv:
    """Options: ``corpus`` (JSONL of id/title/text; default the shipped one), ``top_k`` (3),
    ``max_top_k`` (5), ``passage_words`` (100), ``max_doc_chars`` (4000), ``timeout_s`` (10)."""
    check_options("search", options, OPTIONS)
    tools = _tools(
        options.get("corpus"),
        int(options.get("top_k", 3)),
        int(options.get("max_top_k", 5)),
        int(options.get("passage_words", 100)),
        int(options.get("max_doc_chars", 4000)),
    )
    return ToolEnv(
        with_system(task.messages, SYSTEM_PROMPT),
        tools,
        lambda t: search_reward(t, task.ground_truth),
        timeout_s=float(options.get("timeout_s", 10.0)),
        stateless=True,  # pure tools: rollback needs no state saved
        reward_range=(0.0, 1.0),  # token F1
    )
