"""benchmarks/env_load.py: the JSON it writes (rows with env, concurrency, episodes_per_s,
failure_frac; before/after cost ratios) from a small in-process run, and its stub model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import env_load as bench  # noqa: E402

from toolgrpo.models.tiny import build_tiny_tokenizer  # noqa: E402
from toolgrpo.rollout.generator import SamplingParams  # noqa: E402
from toolgrpo.rollout.prompts import render_prompt  # noqa: E402


def test_stub_model_calls_once_then_answers():
    tok = build_tiny_tokenizer()
    model = bench.StubModel(tok, bench.ADD)
    first = render_prompt(tok, [{"role": "user", "content": "q"}], 10**6)
    (a, b) = model.generate([first], SamplingParams(n=2))
    assert a.token_ids == b.token_ids and "<tool_call>" in tok.decode(a.token_ids)
    later = first + a.token_ids + first  # a second assistant turn's prompt
    (c,) = model.generate([later], SamplingParams())
    assert "<answer>5</answer>" in tok.decode(c.token_ids)


def test_a_run_writes_rows_and_the_before_after_ratio(tmp_path, monkeypatch):
    out = tmp_path / "env_load.json"
    monkeypatch.setattr(bench, "OUT", out)
    before = {"env": "in_process", "concurrency": 2, "env_s_per_episode": 1.0}
    out.write_text(json.dumps({"runs": {"before": {"rows": [before]}}}))
    bench.main(["--envs", "in_process", "--concurrency", "2", "--rounds", "1", "--note", "t"])
    record = json.loads(out.read_text())
    (row,) = record["results"]
    assert (row["env"], row["concurrency"], row["failure_frac"]) == ("in_process", 2, 0.0)
    assert row["episodes_per_s"] > 0 and row["env_s_per_episode"] > 0
    ratio = record["env_cost_ratio"]["in_process@2"]
    assert ratio == round(1.0 / row["env_s_per_episode"], 1)
    assert record["runs"]["after"]["note"] == "t" and record["runs"]["before"]["rows"] == [before]
