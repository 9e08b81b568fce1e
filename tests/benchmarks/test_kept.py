"""benchmarks/kept.py: a kept eval drops only its samples' text and pairs exactly as the original
(a committed real eval and a single-turn one), metrics keep only the keys asked for, the work copy
wins over the kept one, and a directory holds one setting."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import kept  # noqa: E402

from toolgrpo.eval.paired import load_outcomes, load_single_turn  # noqa: E402

REAL_EVAL = REPO / "benchmarks" / "results" / "negatives_evals" / "eval_on.json"


def test_a_kept_episode_eval_lacks_only_the_conversations_and_pairs_the_same(tmp_path):
    dest = tmp_path / "kept" / "eval_on.json"
    assert kept.keep_eval(REAL_EVAL, dest)
    full, small = json.loads(REAL_EVAL.read_text()), json.loads(dest.read_text())
    assert dest.stat().st_size < 0.2 * REAL_EVAL.stat().st_size
    assert {k: v for k, v in full.items() if k != "samples"} == {
        k: v for k, v in small.items() if k != "samples"
    }
    assert len(small["samples"]) == len(full["samples"]) == full["num_episodes"]
    for a, b in zip(full["samples"], small["samples"], strict=True):
        assert "messages" in a and "messages" not in b
        assert {k: v for k, v in a.items() if k != "messages"} == b
    assert load_outcomes(dest) == load_outcomes(REAL_EVAL)
    assert not kept.keep_eval(REAL_EVAL, dest)  # already kept: nothing written
    assert [p.name for p in dest.parent.iterdir()] == ["eval_on.json"]  # no temporary left


def test_a_kept_single_turn_eval_lacks_the_responses_and_gives_the_same_values(tmp_path):
    samples = [
        {"task_id": f"r{i // 2}", "response": "<tool_call>" + "x" * 500, "total": i / 3,
         "format": 1.0, "correctness": float(i % 2), "format_ok": True}
        for i in range(8)
    ]  # fmt: skip
    src = tmp_path / "eval_rlla.json"
    record = {"mode": "single", "num_tasks": 4, "num_samples": 8, "summary": {"total": 1.0}}
    src.write_text(json.dumps(record | {"samples": samples}, indent=1))
    dest = tmp_path / "kept" / "eval_rlla.json"
    kept.keep_eval(src, dest)
    assert "response" not in dest.read_text() and dest.stat().st_size < src.stat().st_size / 4
    for field in ("total", "format", "correctness", "format_ok"):
        assert load_single_turn(dest, field) == load_single_turn(src, field)
    assert json.loads(dest.read_text())["summary"] == {"total": 1.0}


def test_metrics_keep_every_line_with_only_the_keys_asked_for(tmp_path):
    rows = [{"step": 0, "a": 1.0, "big": [0] * 50}, {"step": 1, "big": 2}, {"step": 2, "a": 3}]
    src = tmp_path / "metrics.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    kept.keep_file(src, tmp_path / "k" / "metrics.jsonl", keys=["a"])
    got = [json.loads(x) for x in (tmp_path / "k" / "metrics.jsonl").read_text().splitlines()]
    assert got == [{"step": 0, "a": 1.0}, {"step": 1}, {"step": 2, "a": 3}]
    kept.keep_file(src, tmp_path / "k" / "copy.jsonl")
    assert (tmp_path / "k" / "copy.jsonl").read_text() == src.read_text()


def test_the_work_copy_wins_then_the_kept_one(tmp_path):
    work, kdir = tmp_path / "work", tmp_path / "kept"
    for d in (work, kdir):
        d.mkdir()
    at = kept.finder(work, kdir)
    assert at("a.json") is None and kept.find(work / "a.json", None) is None
    (kdir / "a.json").write_text("{}")
    assert at("a.json") == kdir / "a.json" and kept.finder(work, None)("a.json") is None
    (work / "a.json").write_text("{}")
    assert at("a.json") == work / "a.json"
    assert kept.kept_dir(Path("r/main_job_seeds")) == Path("r/main_job_seeds_kept")
    assert kept.kept_dir(Path("r/negatives.json")) == Path("r/negatives_kept")


def test_a_directory_holds_one_setting(tmp_path):
    work, kdir = tmp_path / "work", tmp_path / "kept"
    setting = {"overrides.json": json.dumps(["a=1"]), "config.sha256": "abc\n"}
    kept.pin([work, kdir], setting)
    assert json.loads((kdir / "overrides.json").read_text()) == ["a=1"]
    kept.pin([tmp_path / "fresh", kdir], {"overrides.json": '[ "a=1" ]', "config.sha256": "abc"})
    with pytest.raises(SystemExit, match="another setting"):
        kept.pin([tmp_path / "new", kdir], {"overrides.json": json.dumps(["a=2"])})
    with pytest.raises(SystemExit, match="config.sha256"):
        kept.pin([tmp_path / "new2", kdir], {"config.sha256": "def\n"})
    assert not (tmp_path / "new").exists() and not (tmp_path / "new2").exists()  # checked first


def test_a_value_in_the_file_or_on_the_command_line_is_one_setting(tmp_path):
    """A config that adopts an override keeps the runs made with it: the setting is the file's
    tree as the overrides leave it (comments, key order and where a value is written do not
    count); another value is another setting."""
    import hashlib

    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text("trainer:\n  seed: 0  # a comment\ndata:\n  train_files: [a, b]\n")
    new.write_text("data:\n  train_files: [a, b, 'c?style=x&n=1']\ntrainer:\n  seed: 0\n")
    adopted = ["data.train_files=[a,b,c?style=x&n=1]"]
    assert kept.setting_digest(old, adopted) == kept.setting_digest(new, [])
    assert kept.setting_digest(old, []) != kept.setting_digest(new, [])
    assert kept.setting_digest(new, ["trainer.seed=1"]) != kept.setting_digest(new, [])
    work, kdir = tmp_path / "work", tmp_path / "kept"
    kept.pin_setting([work, kdir], old, adopted)  # trained with the override...
    kept.pin_setting([tmp_path / "w2", kdir], new, [])  # ... reused once the file says it
    assert json.loads((kdir / "overrides.json").read_text()) == adopted  # as trained
    with pytest.raises(SystemExit, match="another setting"):
        kept.pin_setting([tmp_path / "w3", kdir], old, [])
    # a directory pinned before the setting's hash: checked by the file's hash and overrides
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "config.sha256").write_text(hashlib.sha256(old.read_bytes()).hexdigest() + "\n")
    (legacy / "overrides.json").write_text(json.dumps(adopted))
    with pytest.raises(SystemExit, match="config.sha256"):
        kept.pin_setting([legacy], new, [])  # another file: refused, nothing rewritten
    assert (legacy / "config.sha256").is_file() and not (legacy / "setting.sha256").exists()
    kept.pin_setting([legacy], old, adopted)
    assert not (legacy / "config.sha256").exists()
    kept.pin_setting([legacy], new, [])  # upgraded: the adopted config reuses it


def test_kept_copies_are_never_written_through_a_link(tmp_path):
    """A link at the kept copy, or at its old temporary's name (``.NAME.PID.tmp``), is never
    written through (the temporary's name was predictable and opened by following links)."""
    import os

    from toolgrpo.safe_io import LinkRefused

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    dest = tmp_path / "kept" / "eval_on.json"
    dest.parent.mkdir()
    (dest.parent / f".{dest.name}.{os.getpid()}.tmp").symlink_to(victim)
    assert kept.write_atomic(dest, "{}\n") and dest.read_text() == "{}\n"
    linked = tmp_path / "kept" / "setting.txt"
    linked.symlink_to(victim)
    with pytest.raises(LinkRefused):
        kept.write_atomic(linked, "x")
    assert victim.read_text() == "keep me"
