"""Paired comparison of two ``toolgrpo eval`` runs on the same tasks (issue #16).

Both JSON files must keep every episode (``toolgrpo eval --samples N`` with N ≥ the tasks per
type). Episodes are paired by task id, so the standard error is that of the per-task difference:
much smaller than two independent binomial SEs when both models solve the same easy tasks.

    python scripts/compare_evals.py BEFORE.json AFTER.json [--measure accuracy] [--output FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from toolgrpo.eval.paired import MEASURES, IncompleteEval, format_rows, load_outcomes, paired


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--measure", choices=sorted(MEASURES), default="accuracy")
    ap.add_argument("--output", type=Path)
    args = ap.parse_args(argv)
    try:
        by_type = paired(load_outcomes(args.before), load_outcomes(args.after), args.measure)
    except (IncompleteEval, ValueError) as e:
        raise SystemExit(str(e)) from None
    result = {
        "before": str(args.before),
        "after": str(args.after),
        "measure": args.measure,
        "by_type": by_type,
    }
    print("\n".join(format_rows(by_type)))
    if args.output:
        args.output.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
