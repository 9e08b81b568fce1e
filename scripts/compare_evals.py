"""Paired comparison of two ``toolgrpo eval`` runs on the same tasks (issue #16).

Both JSON files must keep every episode (``toolgrpo eval --samples N`` with N ≥ the tasks per
type). Episodes are paired by task id, so the standard error is that of the per-task difference:
much smaller than two independent binomial SEs when both models solve the same easy tasks.

    python scripts/compare_evals.py BEFORE.json AFTER.json [--output FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from statistics import fmean
from typing import Any

from toolgrpo.eval.episodes import success_threshold


def successes(path: Path) -> dict[str, tuple[str, float]]:
    """task id → (task type, 1.0 if the episode got full marks else 0.0)."""
    record = json.loads(path.read_text())
    samples = record.get("samples", [])
    if len(samples) < record.get("num_episodes", 0):
        raise SystemExit(
            f"{path} keeps {len(samples)} episodes of {record['num_episodes']}: "
            "re-run toolgrpo eval with --samples at least the tasks per type"
        )
    out = {}
    for s in samples:
        ok = math.isfinite(s["reward"]) and s["reward"] >= success_threshold(s["task_type"])
        out[s["task_id"]] = (s["task_type"], float(ok))
    return out


def paired(before: dict[str, tuple[str, float]], after: dict[str, tuple[str, float]]) -> dict:
    common = sorted(before.keys() & after.keys())
    if not common:
        raise SystemExit("the two runs share no task id")
    by_type: dict[str, list[str]] = defaultdict(list)
    for tid in common:
        by_type[before[tid][0]].append(tid)
    by_type["all"] = common
    out: dict[str, Any] = {}
    for name, ids in sorted(by_type.items()):
        diffs = [after[t][1] - before[t][1] for t in ids]
        n = len(diffs)
        mean = fmean(diffs)
        var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else 0.0
        se = math.sqrt(var / n)
        out[name] = {
            "tasks": n,
            "before": fmean(before[t][1] for t in ids),
            "after": fmean(after[t][1] for t in ids),
            "diff": mean,
            "diff_se_paired": se,
            "z": mean / se if se > 0 else float("nan"),
            "gained": sum(d > 0 for d in diffs),  # solved after, not before
            "lost": sum(d < 0 for d in diffs),
        }
    return out


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--output", type=Path)
    args = ap.parse_args(argv)
    result = {
        "before": str(args.before),
        "after": str(args.after),
        "by_type": paired(successes(args.before), successes(args.after)),
    }
    for name, r in result["by_type"].items():
        print(
            f"{name:>12}: {r['before']:.3f} -> {r['after']:.3f}  diff {r['diff']:+.3f} "
            f"± {r['diff_se_paired']:.3f} (paired SE, z={r['z']:.2f}; "
            f"{r['gained']} gained, {r['lost']} lost of {r['tasks']})"
        )
    if args.output:
        args.output.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
