"""Paired comparison of two evaluations: pairing by task id, the paired SE, refusals."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from toolgrpo.eval.paired import IncompleteEval, load_outcomes, paired

ROOT = Path(__file__).resolve().parents[2]


def _write(
    path: Path, episodes: list[tuple[str, str, float, dict[str, int]]], n: int | None = None
):
    samples = [
        {"task_id": tid, "task_type": t, "reward": r, "tool_calls": 1, "tool_errors": err}
        for tid, t, r, err in episodes
    ]
    doc = {"num_episodes": len(samples) if n is None else n, "samples": samples}
    path.write_text(json.dumps(doc))
    return path


def test_paired_difference_and_se_by_hand(tmp_path: Path) -> None:
    before = _write(
        tmp_path / "a.json",
        [
            ("c#0", "calculator", 1.0, {}),
            ("c#1", "calculator", 0.0, {"exception": 1}),
            ("c#2", "calculator", 0.0, {}),
            ("s#0", "search", 0.0, {}),
        ],
    )
    after = _write(
        tmp_path / "b.json",
        [  # listed in another order: pairing is by task id
            ("s#0", "search", 1.0, {}),
            ("c#2", "calculator", 1.0, {}),
            ("c#1", "calculator", 0.0, {}),
            ("c#0", "calculator", 0.0, {}),
        ],
    )
    res = paired(load_outcomes(before), load_outcomes(after))
    calc = res["calculator"]
    # diffs -1, 0, +1: mean 0, sample variance 1, SE sqrt(1/3)
    assert calc["diff"] == 0.0 and calc["up"] == 1 and calc["down"] == 1
    assert calc["diff_se_paired"] == pytest.approx(math.sqrt(1 / 3))
    # all: diffs -1, 0, +1, +1 -> mean 0.25, var (1.5625 + .0625 + .5625 * 2) / 3
    everything = res["all"]
    assert everything["diff"] == pytest.approx(0.25)
    var = (1.25**2 + 0.25**2 + 2 * 0.75**2) / 3
    assert everything["diff_se_paired"] == pytest.approx(math.sqrt(var / 4))
    assert everything["before"] == 0.25 and everything["after"] == 0.5
    errors = paired(load_outcomes(before), load_outcomes(after), "episodes_with_tool_error")
    assert errors["calculator"]["diff"] == pytest.approx(-1 / 3)


def test_non_finite_reward_is_a_failure_and_missing_episodes_are_refused(tmp_path: Path) -> None:
    p = _write(tmp_path / "a.json", [("c#0", "calculator", float("nan"), {})])
    assert load_outcomes(p)["c#0"].success == 0.0
    short = _write(tmp_path / "b.json", [("c#0", "calculator", 1.0, {})], n=100)
    with pytest.raises(IncompleteEval, match="--samples"):
        load_outcomes(short)
    other = _write(tmp_path / "c.json", [("s#9", "search", 1.0, {})])
    with pytest.raises(ValueError, match="no task id"):
        paired(load_outcomes(p), load_outcomes(other))


def test_compare_evals_script_writes_json_and_refuses_in_one_line(tmp_path: Path) -> None:
    a = _write(
        tmp_path / "a.json", [("c#0", "calculator", 0.0, {}), ("c#1", "calculator", 1.0, {})]
    )
    b = _write(
        tmp_path / "b.json", [("c#0", "calculator", 1.0, {}), ("c#1", "calculator", 1.0, {})]
    )
    out = tmp_path / "out.json"
    script = str(ROOT / "scripts" / "compare_evals.py")
    run = subprocess.run(
        [sys.executable, script, str(a), str(b), "--output", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "diff +0.500" in run.stdout
    assert json.loads(out.read_text())["by_type"]["all"]["after"] == 1.0
    short = _write(tmp_path / "s.json", [("c#0", "calculator", 1.0, {})], n=5)
    bad = subprocess.run(
        [sys.executable, script, str(short), str(b)], capture_output=True, text=True
    )
    assert bad.returncode != 0 and "--samples" in bad.stderr and "Traceback" not in bad.stderr
