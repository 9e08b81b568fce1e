"""Build the agent warm-start SFT data: complete episodes of the calculator, search and direct
train tasks, played in the real environments with the gold tool calls the generators know.

    python scripts/make_agent_sft.py [--out src/toolgrpo/data/envs/agent_sft.jsonl] [--seed 0]

Each train task is played once with the environment's own prompt and once under its router
route (CALCULATE, SEARCH, ANSWER for direct), so the LM learns both the tool format and to follow
a route's instruction. Calculator calls replay the generator's expression or equation; search
calls query the question's keywords, then the bridging entity for 2-hop questions, and are kept
only when the results show what the next step needs. Only train splits are read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from make_env_data import calculator_items

from toolgrpo.data.loader import embedded_path, load_tasks, read_rows
from toolgrpo.data.task import Task
from toolgrpo.envs.calculator import numbers_match
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.envs.search import default_corpus, normalize_answer, read_corpus
from toolgrpo.router.infer import conditioner
from toolgrpo.router.routes import ANSWER, CALCULATE, SEARCH
from toolgrpo.sft.agent import GoldCall, GoldError, agent_row, play_gold
from toolgrpo.tools.types import ToolResult

OUT = embedded_path("agent_sft.jsonl", "envs")
ROUTE_OF = {"calculator": CALCULATE, "search": SEARCH, "direct": ANSWER}
_QUESTION_WORDS = set(
    "who what which where when how is was are were does did do the a an in on into by that".split()
)
_NAME = re.compile(r"\b[A-Z][a-z]+ [A-Z][a-z]+\b")


def keywords(question: str) -> str:
    """A search query as a person would type it: the question without its question words."""
    words = re.sub(r"[?,]", " ", question).split()
    return " ".join(w for w in words if w.lower() not in _QUESTION_WORDS)


def calculator_plan(task: Task, work: dict[str, tuple[str, str]]) -> list[list[GoldCall]]:
    kind, expr = work[task.messages[-1]["content"]]
    if kind == "equation":
        return [[GoldCall("solve", {"equation": expr})]]
    return [[GoldCall("calculate", {"expression": expr})]]


def calculator_answer(task: Task, results: list[list[ToolResult]]) -> str:
    """The number as the tool printed it when that is the answer (what the model should copy)."""
    shown = results[0][0].text if results else ""
    return shown if numbers_match(shown, task.ground_truth) else task.ground_truth


def _visible(text: str, results: list[ToolResult]) -> bool:
    return normalize_answer(text) in normalize_answer(" ".join(r.text for r in results))


def search_plans(
    task: Task, docs: dict[str, Any], support: list[str]
) -> list[list[list[GoldCall]]]:
    """Candidate gold plans, best first: one keyword query (enough when its results already hold
    the answer's document, even for a 2-hop question), then the entity's title (1-hop) or a
    second query for the bridging entity (2-hop)."""
    first = [GoldCall("search", {"query": keywords(task.messages[-1]["content"])})]
    if len(support) < 2:
        return [[first], [[GoldCall("search", {"query": docs[support[0]].title})]]]
    bridge = docs[support[1]]
    names = [bridge.title, *(n for n in _NAME.findall(bridge.text) if n != bridge.title)]
    return [[first], *([first, [GoldCall("search", {"query": n})]] for n in dict.fromkeys(names))]


def search_check(task: Task, support: list[str], plan: list[list[GoldCall]]) -> Any:
    """The last turn must return the answer's document with the answer in it; an earlier turn
    must show the name the next query uses."""

    def check(turn: int, results: list[ToolResult]) -> bool:
        if turn == len(plan) - 1:
            found = any(f"doc_id: {support[-1]} " in r.text for r in results)
            return found and _visible(task.ground_truth, results)
        return _visible(plan[turn + 1][0].arguments["query"], results)

    return check


def play(
    task: Task, envs: EnvRouter, route: str | None, work: Any, docs: Any, support: Any
) -> dict | None:
    cond = conditioner(route) if route else None
    if task.task_type == "direct":
        plans: list[list[list[GoldCall]]] = [[]]
    elif task.task_type == "calculator":
        plans = [calculator_plan(task, work)]
    else:
        sup = support[task.messages[-1]["content"]]
        plans = search_plans(task, docs, sup)
    for plan in plans:
        check = search_check(task, sup, plan) if task.task_type == "search" else None
        answer = task.ground_truth
        if task.task_type == "calculator":  # the answer as the tool prints it
            env = envs.make(task)
            try:
                probe = asyncio.run(play_gold(env, plan, answer, cond))
                answer = calculator_answer(task, probe.results)
            except GoldError:
                continue
        try:
            ep = asyncio.run(play_gold(envs.make(task), plan, answer, cond, check=check))
        except GoldError:
            continue
        return agent_row(task, ep, route)
    return None


def build_rows(seed: int, limit: int = -1) -> tuple[list[dict[str, Any]], Counter]:
    """Rows of every train task (or the first ``limit`` of each type), env by env."""
    work = {
        rw["prompt"][0]["content"]: (rw["extra_info"]["kind"], w)
        for rw, w in calculator_items(seed)
    }
    docs = {d.id: d for d in read_corpus(default_corpus())}
    support = {  # question -> the documents that hold its answer (and its bridge)
        rw["prompt"][0]["content"]: rw["extra_info"]["support"]
        for rw in read_rows(embedded_path("search_train.jsonl", "envs"))
    }
    envs = EnvRouter()
    rows, stats = [], Counter()
    for env in ("calculator", "search", "direct"):
        tasks = load_tasks([f"{env}:train"], bad_rows="error").tasks
        for task in tasks[:limit] if limit > 0 else tasks:
            for route in (None, ROUTE_OF[env]):
                row = play(task, envs, route, work, docs, support)
                stats[f"{env}/{'routed' if route else 'plain'}/{'ok' if row else 'skipped'}"] += 1
                if row is not None:
                    rows.append(row)
    return rows, stats


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--seed", type=int, default=0, help="the seed make_env_data.py used")
    ap.add_argument("--limit", type=int, default=-1, help="only the first N tasks of each type")
    args = ap.parse_args(argv)
    rows, stats = build_rows(args.seed, args.limit)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    for k, v in sorted(stats.items()):
        print(f"{k}: {v}")
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
