"""benchmarks/behaviour.py: the shares an eval JSON keeps beside accuracy."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from behaviour import arm_behaviour, eval_behaviour  # noqa: E402
from kept import keep_eval  # noqa: E402


def _sample(reward, has_answer, calls=0, errors=None):
    return {
        "task_id": f"t{reward}{has_answer}{calls}",
        "task_type": "search",
        "reward": reward,
        "reward_parts": {"f1": reward or 0.0, "has_answer": has_answer},
        "tool_calls": calls,
        "tool_errors": errors or {},
        "messages": [{"role": "user", "content": "q"}],
    }


def _write(path: Path, samples: list[dict]) -> Path:
    path.write_text(json.dumps({"num_episodes": len(samples), "samples": samples}))
    return path


def test_shares_count_episodes_and_calls(tmp_path):
    path = _write(tmp_path / "e.json", [
        _sample(1.0, 1.0, calls=1),
        _sample(0.5, 1.0, calls=3, errors={"bad_args": 1}),
        _sample(0.0, 0.0, calls=0),
        _sample(None, 0.0, calls=2, errors={"timeout": 2}),  # no reward: counts as 0
    ])  # fmt: skip
    got = eval_behaviour(path)
    assert got == pytest.approx(
        {"answered": 0.5, "tool_call": 0.75, "tool_error": 3 / 6, "reward": 1.5 / 4}
    )


def test_a_kept_compact_eval_gives_the_same_shares(tmp_path):
    full = _write(tmp_path / "full.json", [_sample(1.0, 1.0, 2), _sample(0.0, 1.0, 1, {"x": 1})])
    compact = tmp_path / "compact.json"
    keep_eval(full, compact)
    assert "messages" not in compact.read_text()
    assert eval_behaviour(compact) == eval_behaviour(full)


def test_an_arm_averages_its_seeds_and_an_eval_without_episodes_is_refused(tmp_path):
    a = _write(tmp_path / "a.json", [_sample(1.0, 1.0, 1), _sample(0.0, 0.0)])
    b = _write(tmp_path / "b.json", [_sample(0.0, 1.0), _sample(0.0, 1.0)])
    got = arm_behaviour([a, b])
    assert got["answered"] == pytest.approx(0.75) and got["tool_call"] == pytest.approx(0.25)
    assert got["reward"] == pytest.approx(0.25) and len(got["per_seed"]) == 2
    assert arm_behaviour([]) == {}
    with pytest.raises(ValueError, match="keeps no episodes"):
        eval_behaviour(_write(tmp_path / "none.json", []))
