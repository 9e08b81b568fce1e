"""The ``arith_mixed`` part of ``make_env_data.py``: arithmetic where the calculator helps only
sometimes. Half the questions are easy without a tool (single-digit sums and products, or a
multi-digit result stated in the question), half need it (multi-digit products and divisions);
``extra_info.needs_tool`` says which, so a benchmark can score the router's tool choice (AUROC).

    python scripts/env_data_arith.py [--out src/toolgrpo/data/envs] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from env_data_direct import direct_rows

from toolgrpo.envs.calculator import calculate, numbers_match

N_TRAIN, N_TEST = 400, 100
OUT = Path(__file__).resolve().parents[1] / "src" / "toolgrpo" / "data" / "envs"
Maker = Callable[[random.Random], tuple[str, str, int]]  # question, expression, exact answer


def row(question: str, answer: str, kind: str, needs_tool: bool) -> dict[str, Any]:
    return {
        "data_source": "arith_mixed",
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"task_type": "arith_mixed", "kind": kind, "needs_tool": needs_tool},
    }


# ---- easy: answerable in one's head or read off the question -------------------------------------
def small_sum(r: random.Random) -> tuple[str, str, int]:
    terms = [r.randint(1, 9) for _ in range(r.choice((2, 2, 3)))]
    e = " + ".join(map(str, terms))
    if len(terms) == 2 and r.random() < 0.5:
        return f"Add {terms[0]} and {terms[1]}.", e, sum(terms)
    return f"What is {e}?", e, sum(terms)


def small_product(r: random.Random) -> tuple[str, str, int]:
    a, b = r.randint(2, 9), r.randint(2, 9)
    return r.choice((f"What is {a} * {b}?", f"What is {a} times {b}?")), f"{a} * {b}", a * b


def stated(r: random.Random) -> tuple[str, str, int]:
    """A multi-digit result given in the question: it looks like calculator work, but is not."""
    a, b = r.randint(1000, 9999), r.randint(101, 999)
    p = a * b
    kind = r.randrange(3)
    if kind == 0:
        return f"{a} * {b} = {p}. Using this, what is {a} * {b}?", f"{a} * {b}", p
    if kind == 1:
        return f"Given that {p} / {b} = {a}, what is {p} divided by {b}?", f"{p} / {b}", a
    q = f"The product of {a} and {b} is {p}. What is the product of {a} and {b}?"
    return q, f"{a} * {b}", p


# ---- hard: multi-digit work a small model gets wrong in its head ---------------------------------
def product(r: random.Random) -> tuple[str, str, int]:
    a, b = r.randint(1000, 9999), r.randint(101, 999)
    return r.choice((f"What is {a} * {b}?", f"Multiply {a} by {b}.")), f"{a} * {b}", a * b


def division(r: random.Random) -> tuple[str, str, int]:
    a, b = r.randint(1000, 9999), r.randint(101, 999)
    return f"What is {a * b} divided by {b}?", f"{a * b} / {b}", a


EASY: list[tuple[str, Maker]] = [
    ("small_sum", small_sum),
    ("small_product", small_product),
    ("stated", stated),
]
HARD: list[tuple[str, Maker]] = [("product", product), ("division", division)]


def arith_mixed_rows(seed: int, total: int, exclude: Collection[str] = ()) -> list[dict]:
    """``total`` distinct questions, easy and hard in turn (each list's kinds in turn), none in
    ``exclude``; every answer is checked against the environment's own ``calculate``."""
    r = random.Random(f"arith_mixed-{seed}")
    rows: list[dict[str, Any]] = []
    seen = set(exclude)
    counts = [0, 0]
    while len(rows) < total:
        hard = len(rows) % 2
        kinds = HARD if hard else EASY
        name, make = kinds[counts[hard] % len(kinds)]
        q, e, want = make(r)
        if q in seen:
            continue
        seen.add(q)
        counts[hard] += 1
        assert numbers_match(calculate(e), str(want)), (q, e, want)  # the tool gets it right
        rows.append(row(q, str(want), name, bool(hard)))
    return rows


def balanced_split(rows: list[dict[str, Any]], seed: int) -> tuple[list[dict], list[dict]]:
    """Train and test with exactly half of each needing the tool (AUROC on balanced labels)."""
    r = random.Random(f"arith_mixed-split-{seed}")
    halves = [[rw for rw in rows if rw["extra_info"]["needs_tool"] is b] for b in (False, True)]
    for h in halves:
        r.shuffle(h)
    test = [rw for h in halves for rw in h[: N_TEST // 2]]
    train = [rw for h in halves for rw in h[N_TEST // 2 :]]
    r.shuffle(test)
    r.shuffle(train)
    for name, part in (("train", train), ("test", test)):
        for i, rw in enumerate(part):
            rw["extra_info"] = {"split": name, "index": i, **rw["extra_info"]}
    return train, test


def write_arith_mixed(out: Path, seed: int) -> None:
    """``arith_mixed_{train,test}.jsonl``, sharing no question with the direct task set (whose
    small sums and products read the same), so neither set's test questions are trained on."""
    direct = {rw["prompt"][0]["content"] for rw in direct_rows(seed, N_TRAIN + N_TEST)}
    train, test = balanced_split(arith_mixed_rows(seed, N_TRAIN + N_TEST, direct), seed)
    for name, part in (("train", train), ("test", test)):
        text = "".join(json.dumps(rw, ensure_ascii=False) + "\n" for rw in part)
        (out / f"arith_mixed_{name}.jsonl").write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    write_arith_mixed(args.out, args.seed)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
