"""benchmarks/mixture_teacher.py's pure parts: each arm's command line loads and validates against
the real configs, the fixed policy's successes become SFT examples the tiny model's tokenizer
accepts, and the summary pairs every arm with actor_only by task."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from statistics import fmean, stdev

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import mixture_teacher as mt  # noqa: E402

from toolgrpo.config.loader import load_config  # noqa: E402
from toolgrpo.config.schema import TrainConfig  # noqa: E402
from toolgrpo.config.validate import validate_sft_config, validate_train_config  # noqa: E402
from toolgrpo.sft.config import SFTConfig  # noqa: E402


@pytest.mark.parametrize("arm", ["actor_only", "design_is", "mixed_shaped", "mixed_shaped_norm"])
def test_each_rl_arm_is_a_valid_command_line_of_the_main_job(arm, tmp_path):
    ov = mt.arm_overrides(arm, 16) + ["trainer.seed=1", f"trainer.output_dir={tmp_path}"]
    cfg = load_config(TrainConfig, str(mt.CONFIG), ov)
    validate_train_config(cfg)
    assert cfg.actor_rollout_ref.model.path == mt.ACTOR
    assert cfg.actor_rollout_ref.rollout.n == 4  # the same actor samples per task everywhere
    ro, sc = cfg.rollout_only, cfg.rollout_allocation_schedule
    if arm == "actor_only":
        assert not ro.model_path and cfg.trainer.total_training_steps == 16
    elif arm == "design_is":  # the design's defaults, twice the steps for as many actor samples
        assert ro.model_path == mt.TEACHER and cfg.trainer.total_training_steps == 32
        assert (sc.type, sc.alpha, sc.per_sample, sc.groups) == ("constant", 0.5, False, "whole")
        assert (ro.fixed_loss, ro.bypass_mode, ro.rollout_is, ro.rollout_is_threshold) == (
            "is",
            False,
            "sequence",
            2.0,
        )
    else:
        assert (sc.groups, sc.fixed_per_group, sc.alpha) == ("mixed", 1, 0.0)
        assert (ro.fixed_loss, ro.shaping_gamma) == ("shaped", 0.1)
        assert ro.shaping_normalize == (arm == "mixed_shaped_norm")


def test_the_sft_arm_is_a_valid_sft_command_line(tmp_path):
    ov = mt.sft_overrides(tmp_path / "t.jsonl", 128, tmp_path / "out", 1)
    cfg = load_config(SFTConfig, str(mt.SFT_CONFIG), ov)
    validate_sft_config(cfg)
    assert cfg.model.path == mt.ACTOR and cfg.model.lora_rank > 0
    assert cfg.trainer.total_training_steps * cfg.data.train_batch_size == 128
    assert cfg.data.train_files == [str(tmp_path / "t.jsonl")]


def _dump_row(step, policy, reward, task_type="calculator", negative=False, q="What is 2+3?"):
    messages = [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": q},
        {"role": "assistant", "content": "<answer>5</answer>"},
    ]
    return {
        "step": step,
        "task_id": f"calc-{step}",
        "task_type": task_type,
        "uid": "u",
        "policy": policy,
        "negative": negative,
        "messages": [] if negative else messages,
        "reward": reward,
    }


def test_the_fixed_policys_successes_become_sft_examples(tmp_path, tiny_model_dir):
    from toolgrpo.models.loading import load_tokenizer
    from toolgrpo.rollout.hf import stop_token_ids
    from toolgrpo.sft.data import build_examples

    dumps = tmp_path / "rollout_data"
    dumps.mkdir()
    rows = {
        1: [
            _dump_row(1, "actor", 1.0),  # the actor's: never teacher data
            _dump_row(1, "fixed", 1.0, q="What is 7*6?"),
            _dump_row(1, "fixed", 0.0),
            _dump_row(1, "fixed", None, negative=True),  # a rolled-back attempt: not a sample
        ],
        2: [_dump_row(2, "fixed", 1.0, q="What is 9-4?"), _dump_row(2, "fixed", None)],
    }
    for step, rs in rows.items():
        (dumps / f"{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
    got, fixed = mt.teacher_rows(dumps)
    assert fixed == 4 and len(got) == 2
    assert [r["source"] for r in got] == ["calc-1@1", "calc-2@2"]
    data = tmp_path / "teacher.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in got))
    tok = load_tokenizer(tiny_model_dir)
    examples, dropped = build_examples(
        tok, [str(data)], "ground_truth", 2048, set(stop_token_ids(tok))
    )
    assert len(examples) == 2 and dropped == 0
    assert all(sum(e.loss_mask) > 0 for e in examples)  # the assistant's turns are trained


def _eval(path: Path, solved: set[int], n: int = 20) -> None:
    samples = [
        {"task_id": f"t{i}", "task_type": "calculator", "reward": float(i in solved)}
        for i in range(n)
    ]
    path.write_text(json.dumps({"num_episodes": n, "samples": samples}))


def _metrics(run: Path, equal_fracs: list[float], using_actor: float | None = None) -> None:
    run.mkdir(parents=True)
    recs = []
    for step, f in enumerate(equal_fracs, 1):
        r = {"step": step, "batch/size": 40.0, "reward/groups_all_equal_frac": f}
        if using_actor is not None:
            r |= {"rollout/using_actor": using_actor, "rollout/using_fixed": 1 - using_actor}
        recs.append(r)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_the_summary_pairs_each_arm_with_actor_only_by_task(tmp_path):
    w = tmp_path
    _eval(w / "eval_actor_only_seed0.json", set())
    _eval(w / "eval_actor_only_seed1.json", {0})
    _eval(w / "eval_mixed_shaped_seed0.json", {0, 1, 2, 3})
    _eval(w / "eval_mixed_shaped_seed1.json", {0, 1})
    _eval(w / "eval_sft_teacher_seed0.json", {5})  # seed 1 not evaluated yet
    _eval(w / "eval_teacher.json", set(range(8)))
    _metrics(w / "actor_only_seed0", [1.0, 1.0])
    _metrics(w / "actor_only_seed1", [1.0, 0.5])
    _metrics(w / "mixed_shaped_seed0", [0.25, 0.75], using_actor=0.8)
    _metrics(w / "mixed_shaped_seed1", [0.5, 0.5], using_actor=0.8)
    (w / "sft_teacher_seed0").mkdir()
    (w / "sft_teacher_seed0" / "sft_result.json").write_text('{"examples": 51}')
    out = mt.summarize(w, [0, 1])
    assert [a["arm"] for a in out["arms"]] == ["actor_only", "mixed_shaped", "sft_teacher"]
    base, mixed, sft = out["arms"]
    assert base["gain_vs_actor_only"] == 0.0 and base["gain_se"] == 0.0
    assert base["accuracy"] == pytest.approx(2.5) and base["nonzero_adv_group_frac"] == 0.125
    # gains per task: seed 0 tasks 0-3 +1; seed 1 task 1 +1 (task 0 solved by both)
    per_task = [0.0] * 20
    for t, g in ((0, 0.5), (1, 1.0), (2, 0.5), (3, 0.5)):
        per_task[t] = g
    se_tasks = stdev(per_task) / math.sqrt(20)
    se_seeds = stdev([0.2, 0.05]) / math.sqrt(2)
    assert mixed["gain_vs_actor_only"] == pytest.approx(100 * fmean(per_task))
    assert mixed["gain_se"] == pytest.approx(100 * math.hypot(se_tasks, se_seeds))
    assert mixed["accuracy"] == pytest.approx(15.0)
    assert mixed["nonzero_adv_group_frac"] == pytest.approx(0.5)
    assert mixed["behaviour"]["reward"] == pytest.approx(0.15)  # 4/20 and 2/20 over the seeds
    assert [b["reward"] for b in mixed["behaviour"]["per_seed"]] == pytest.approx([0.2, 0.1])
    assert (mixed["actor_samples"], mixed["fixed_samples"]) == (64, 16)
    assert sft["seeds"] == [0] and sft["gain_vs_actor_only"] == pytest.approx(5.0)
    assert sft["nonzero_adv_group_frac"] is None and sft["sft_unique_examples"] == [51]
    assert out["references"]["teacher"]["accuracy"] == pytest.approx(40.0)
    json.dumps(out)  # the result file is plain JSON
    for key in ("arm", "seeds", "accuracy", "se", "gain_vs_actor_only", "gain_se"):
        assert all(key in a for a in out["arms"])


def _no_run(*args: str, log: Path) -> None:
    raise AssertionError(f"ran toolgrpo {' '.join(args)}")


def _finished(run: Path, steps: int) -> None:
    ck = run / "checkpoints" / f"global_step_{steps}"
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text("{}")


def test_a_checkout_with_only_the_kept_copies_resumes_and_reports_the_same(tmp_path, monkeypatch):
    monkeypatch.setattr(mt, "toolgrpo", _no_run)  # every (arm, seed) is done: nothing may run
    w, out = tmp_path / "work", tmp_path / "results" / "mixture_teacher.json"
    w.mkdir()
    for name, solved in (("actor_only_seed0", set()), ("design_is_seed0", {1}),
                         ("mixed_shaped_seed0", {0, 1, 2}), ("sft_teacher_seed0", {5}),
                         ("teacher", set(range(8))), ("actor_start", set())):  # fmt: skip
        _eval(w / f"eval_{name}.json", solved)
        record = json.loads((w / f"eval_{name}.json").read_text())
        for s in record["samples"]:
            s["messages"] = [{"role": "user", "content": "What is 2+3?"}]
        (w / f"eval_{name}.json").write_text(json.dumps(record))
    _metrics(w / "actor_only_seed0", [1.0, 1.0])
    _metrics(w / "design_is_seed0", [1.0, 0.5, 0.5, 0.5], using_actor=0.5)
    _metrics(w / "mixed_shaped_seed0", [0.25, 0.75], using_actor=0.8)
    for run, steps in (("actor_only_seed0", 2), ("design_is_seed0", 4), ("mixed_shaped_seed0", 2)):
        _finished(w / run, steps)
        with (w / run / "metrics.jsonl").open("a") as fh:  # a metric the summary never reads
            fh.write(json.dumps({"step": 3, "timing/step_s": 80.0}) + "\n")
    dumps = w / "mixed_shaped_seed0" / "rollout_data"
    dumps.mkdir()
    rows = [_dump_row(1, "actor", 1.0), _dump_row(1, "fixed", 1.0), _dump_row(2, "fixed", 0.0)]
    (dumps / "1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (w / "sft_teacher_seed0").mkdir()
    (w / "sft_teacher_seed0" / "sft_result.json").write_text('{"examples": 1, "steps": 1}')

    def run(work: Path, *extra: str) -> dict:
        mt.main(["--seeds", "0", "--steps", "2", "--work", str(work), "--out", str(out), *extra])
        result = json.loads(out.read_text())
        assert len(result["arms"]) == 4 and len(result["references"]) == 2
        return result

    full = run(w)  # the full work directory: keeps the copies
    kept = tmp_path / "results" / "mixture_teacher_kept"
    assert (kept / "eval_teacher.json").is_file() and (kept / "setting.json").is_file()
    assert not list(kept.rglob("rollout_data")) and not list(kept.rglob("checkpoints"))
    assert "messages" not in (kept / "eval_sft_teacher_seed0.json").read_text()
    assert "timing" not in (kept / "design_is_seed0" / "metrics.jsonl").read_text()
    assert run(tmp_path / "fresh") == full  # a fresh checkout: every (arm, seed) reused
    assert run(tmp_path / "fresh2", "--report") == full
    assert mt.summarize(tmp_path / "empty", [0], kept) == mt.summarize(w, [0])
    # SFT needs nothing but the kept teacher data: the very successes of the run's dumps
    data, fixed = mt.teacher_data(tmp_path / "empty", kept, 0, 2, tmp_path / "log")
    assert data.parent == kept and fixed == 2
    assert [json.loads(x) for x in data.read_text().splitlines()] == mt.teacher_rows(dumps)[0]
    with pytest.raises(SystemExit, match="another setting"):  # kept runs of other --steps
        run(tmp_path / "other", "--steps", "3")
