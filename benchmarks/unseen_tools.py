"""The unseen-tools eval (``schemas:test``: calls to generated functions no training task shows,
in both prompt styles) before and after a training run, paired by task, per seed and pooled."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from statistics import fmean, stdev

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from seed_stats import two_way_se  # noqa: E402

from toolgrpo.eval.paired import load_parts, paired_values  # noqa: E402

SCHEMAS = "schemas:test"  # calls to functions no training task shows, both prompt styles
SCHEMA_MEASURES = ("format_valid", "names_ok", "correct")


def schema_fields(before: Path, after: Path, cells: dict[str, dict[str, list[float]]]) -> dict:
    """The unseen-tools eval before and after, per measure (well-formed calls, the right function
    names, the exact call set; percent of the 480 answers: 240 items in each prompt style),
    paired by task, with each style's own row; ``cells`` gathers each task's difference for the
    pooled SE."""
    out: dict = {"schemas_before": {}, "schemas_after": {}, "schemas_diff": {}, "schemas_se": {}}
    by_style: dict = {}
    for m in SCHEMA_MEASURES:
        b, a = load_parts(before, m), load_parts(after, m)
        p = paired_values({t: v for t, (_, v) in b.items()}, {t: v for t, (_, v) in a.items()})
        out["schemas_before"][m] = 100 * p["before"]
        out["schemas_after"][m] = 100 * p["after"]
        out["schemas_diff"][m] = 100 * p["diff"]
        out["schemas_se"][m] = 100 * p["diff_se_paired"]
        for style in sorted({k for k, _ in b.values()}):
            ids = [t for t, (k, _) in b.items() if k == style]
            q = paired_values({t: b[t][1] for t in ids}, {t: a[t][1] for t in ids if t in a})
            by_style.setdefault(style, {})[m] = {
                "before": 100 * q["before"],
                "after": 100 * q["after"],
                "diff": 100 * q["diff"],
                "se": 100 * q["diff_se_paired"],
            }
        for t in b.keys() & a.keys():
            cells[m].setdefault(t, []).append(a[t][1] - b[t][1])
    out["schemas_by_style"] = by_style
    return out


def pooled_schemas(rows: list[dict], cells: dict[str, dict[str, list[float]]]) -> dict:
    """Pooled unseen-tools differences over seeds: mean and crossed tasks x seeds SE."""
    if not rows:
        return {}
    out: dict = {"schemas_diff": {}, "schemas_se": {}, "schemas_z": {}}
    for m, per_task in cells.items():
        full = [v for v in per_task.values() if len(v) == len(rows)]
        if not full:
            continue
        mean = 100 * fmean(fmean(v) for v in full)
        if len(rows) > 1:
            se = 100 * two_way_se(full)
        else:
            se = 100 * stdev(v[0] for v in full) / math.sqrt(len(full))
        out["schemas_diff"][m], out["schemas_se"][m] = mean, se
        out["schemas_z"][m] = mean / se if se > 0 else float("nan")
    out["schemas_before"] = {m: fmean(r["schemas_before"][m] for r in rows) for m in cells}
    out["schemas_after"] = {m: fmean(r["schemas_after"][m] for r in rows) for m in cells}
    return out
