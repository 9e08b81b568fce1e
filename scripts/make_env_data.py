"""Regenerate the shipped environment task data (seeded: same seed, same bytes).

    python scripts/make_env_data.py [--out src/toolgrpo/data/envs] [--seed 0]

Calculator tasks are checked against the environment's own tools; search questions are checked
to have their answer in the supporting document of the generated fictional corpus; direct
questions (``env_data_direct``) carry everything needed to answer them; arith_mixed questions
(``env_data_arith``) need the calculator for half of them, and say which.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

from env_data_arith import write_arith_mixed
from env_data_direct import direct_rows
from env_data_search import N_TEST, N_TRAIN, row, search_world

from toolgrpo.envs.calculator import calculate, numbers_match, solve

OUT = Path(__file__).resolve().parents[1] / "src" / "toolgrpo" / "data" / "envs"


def exact(x: Fraction) -> str:
    """An int, a finite decimal, or p/q: the ground truth as the model should write it."""
    if x.denominator == 1:
        return str(x.numerator)
    d = x.denominator
    while d % 2 == 0:
        d //= 2
    while d % 5 == 0:
        d //= 5
    if d != 1:
        return f"{x.numerator}/{x.denominator}"
    places = next(p for p in range(1, 20) if (x * 10**p).denominator == 1)
    return f"{float(x):.{places}f}"


def signed(c: int, term: str = "") -> str:
    return f"{'-' if c < 0 else '+'} {abs(c) if abs(c) != 1 or not term else ''}{term}"


# ---- calculator ---------------------------------------------------------------------------------
def arithmetic(r: random.Random) -> tuple[str, str, str]:
    """(question, expression, answer) for multi-digit arithmetic."""
    a, b, c = r.randint(1000, 9999), r.randint(101, 999), r.randint(1000, 9999)
    d = r.randint(11, 99)
    kind = r.randrange(7)
    if kind == 0:
        e, q = f"{a} * {b} - {c}", f"What is {a} * {b} - {c}?"
    elif kind == 1:
        e, q = f"({a} + {c}) * {b}", f"What is ({a} + {c}) * {b}?"
    elif kind == 2:
        e, q = f"{a} * {d} + {b} * {c}", f"What is {a} * {d} + {b} * {c}?"
    elif kind == 3:
        e, q = f"{b}**2 - {a}", f"What is {b} squared minus {a}?"
    elif kind == 4:
        e, q = f"{a * b} / {b}", f"What is {a * b} divided by {b}?"
    elif kind == 5:
        e, q = f"{d} * {c} / 100", f"What is {d}% of {c}?"
    else:
        e, q = f"{a * b + c} % {b}", f"What is the remainder when {a * b + c} is divided by {b}?"
    return q, e, calculate(e)


def word_problem(r: random.Random) -> tuple[str, str, str]:
    """(question, expression, answer) for a two- or three-step story."""
    n1, n2, k = r.randint(120, 980), r.randint(12, 96), r.randint(12, 60)
    kind = r.randrange(6)
    if kind == 0:
        n3 = r.randint(1000, n1 * n2 - 1)
        q = (
            f"A warehouse holds {n1} boxes with {n2} items in each box. {n3} items are shipped "
            "out. How many items are left?"
        )
        e = f"{n1} * {n2} - {n3}"
    elif kind == 1:
        v1, t1, v2, t2 = r.randint(45, 140), r.randint(3, 19), r.randint(45, 140), r.randint(2, 9)
        q = (
            f"A train travels at {v1} km/h for {t1} hours, then at {v2} km/h for {t2} hours. "
            "How many kilometres does it travel in total?"
        )
        e = f"{v1} * {t1} + {v2} * {t2}"
    elif kind == 2:
        cents = r.randint(215, 1995)
        bill = (n2 * cents // 5000 + 1) * 50
        q = (
            f"Mira buys {n2} notebooks at ${cents // 100}.{cents % 100:02d} each and pays with "
            f"${bill}. How much change, in dollars, does she get?"
        )
        e = f"{bill} - {n2} * {cents} / 100"
    elif kind == 3:
        q = (
            f"An orchard has {n2} rows of {n1} trees, and each tree gives {k} apples. How many "
            "apples does the orchard give?"
        )
        e = f"{n2} * {n1} * {k}"
    elif kind == 4:
        total = r.randint(150, 4000) * n2
        q = (
            f"A bonus of ${total} is shared equally among {n2} employees, and each gives ${k} "
            "to charity. How many dollars does each employee keep?"
        )
        e = f"{total} / {n2} - {k}"
    else:
        length, width, price = r.randint(40, 900), r.randint(25, 600), r.randint(7, 49)
        q = (
            f"A rectangular field is {length} m long and {width} m wide. Fencing costs ${price} "
            "per metre. How many dollars does it cost to fence the whole field?"
        )
        e = f"2 * ({length} + {width}) * {price}"
    return q, e, calculate(e)


def equation(r: random.Random) -> tuple[str, str, str]:
    """(question, equation for ``solve``, exact root): linear, or a quadratic's positive root."""
    x, a, b = r.randint(-40, 60), r.randint(2, 29), r.randint(3, 199)
    kind = r.randrange(4)
    if kind == 0:
        b = r.choice([-b, b])
        eq, ans = f"{a}x {signed(b)} = {a * x + b}", Fraction(x)
    elif kind == 1:
        c = r.choice([k for k in range(2, 30) if k != a])
        eq, ans = f"{a}(x + {b}) = {c}x {signed(a * (x + b) - c * x)}", Fraction(x)
    elif kind == 2:
        c = r.randint(-300, 300)
        eq, ans = f"{a}x {signed(b)} = {c}", Fraction(c - b, a)
    else:  # (lead*x - p)(x + n) = 0
        p, n, lead = r.randint(1, 40), r.randint(1, 40), r.choice([1, 1, 2, 3, 5])
        mid = lead * n - p
        head = "x^2" if lead == 1 else f"{lead}x^2"
        eq = f"{head} {signed(mid, 'x') + ' ' if mid else ''}{signed(-p * n)} = 0"
        return f"Find the positive solution of {eq}.", eq, exact(Fraction(p, lead))
    return f"Solve {eq} for x.", eq, exact(ans)


def calculator_rows(seed: int) -> list[dict[str, Any]]:
    return [rw for rw, _ in calculator_items(seed)]


def calculator_items(seed: int) -> list[tuple[dict[str, Any], str]]:
    """(row, gold work): the expression for ``calculate`` or the equation for ``solve`` that the
    row's answer came from (``make_agent_sft.py`` replays it as the gold tool call)."""
    r = random.Random(f"calculator-{seed}")
    kinds: list[tuple[str, Callable[[random.Random], tuple[str, str, str]]]] = [
        ("arithmetic", arithmetic),
        ("word_problem", word_problem),
        ("equation", equation),
    ]
    rows, seen = [], set()
    while len(rows) < N_TRAIN + N_TEST:
        name, make = kinds[len(rows) % 3]
        q, work, ans = make(r)
        if q in seen:
            continue
        seen.add(q)
        if name == "equation":
            roots = [s.split(" = ")[1].split(" (")[0] for s in solve(work).split("; ")]
            assert any(numbers_match(v, ans) for v in roots), (q, roots, ans)
        else:
            assert numbers_match(calculate(work), ans), (q, work, ans)
        rows.append((row("calculator", q, ans, {"kind": name}), work))
    return rows


def split(rows: list[dict[str, Any]], seed: int) -> tuple[list[dict], list[dict]]:
    random.Random(f"split-{seed}").shuffle(rows)
    parts = rows[:N_TRAIN], rows[N_TRAIN : N_TRAIN + N_TEST]
    for name, part in zip(("train", "test"), parts, strict=True):
        for i, rw in enumerate(part):
            rw["extra_info"] = {"split": name, "index": i, **rw["extra_info"]}
    return parts


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    text = "".join(json.dumps(rw, ensure_ascii=False) + "\n" for rw in rows)
    path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    train, test = split(calculator_rows(args.seed), args.seed)
    write_jsonl(args.out / "calculator_train.jsonl", train)
    write_jsonl(args.out / "calculator_test.jsonl", test)
    docs, questions = search_world(args.seed)
    write_jsonl(args.out / "search_corpus.jsonl", docs)
    train, test = split(questions, args.seed)
    write_jsonl(args.out / "search_train.jsonl", train)
    write_jsonl(args.out / "search_test.jsonl", test)
    train, test = split(direct_rows(args.seed, N_TRAIN + N_TEST), args.seed)
    write_jsonl(args.out / "direct_train.jsonl", train)
    write_jsonl(args.out / "direct_test.jsonl", test)
    write_arith_mixed(args.out, args.seed)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
