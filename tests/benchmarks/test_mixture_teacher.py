"""benchmarks/mixture_teacher*.py's pure parts: each arm's command line loads and validates against
the real configs (the recipe arm is configs/mixture_teacher.yaml itself), the fixed policy's
successes become SFT examples the tiny model's tokenizer accepts, pass@k follows its formula, and
the summary pairs every arm with actor_only by task on both measures."""

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
from toolgrpo.config.schema import TrainConfig, as_dict  # noqa: E402
from toolgrpo.config.validate import validate_sft_config, validate_train_config  # noqa: E402
from toolgrpo.sft.config import SFTConfig  # noqa: E402


def _arm_config(arm: str, tmp_path: Path) -> TrainConfig:
    ov = mt.arm_overrides(arm, 16) + ["trainer.seed=1", f"trainer.output_dir={tmp_path}"]
    cfg = load_config(TrainConfig, str(mt.config_of(arm)), ov)
    validate_train_config(cfg)
    return cfg


@pytest.mark.parametrize("arm", mt.RL_ARMS)
def test_each_rl_arm_is_a_valid_command_line_of_the_main_job(arm, tmp_path):
    cfg = _arm_config(arm, tmp_path)
    assert cfg.actor_rollout_ref.model.path == mt.ACTOR
    assert cfg.actor_rollout_ref.rollout.n == 4  # the same actor samples per task everywhere
    assert not cfg.algorithm.filter_groups.enable and cfg.trainer.test_freq == -1
    # the environments the teacher plays, whatever else the main job's config trains on
    assert cfg.data.train_files == ["calculator:train", "search:train", "direct:train"]
    ro, sc, a = cfg.rollout_only, cfg.rollout_allocation_schedule, cfg.actor_rollout_ref.actor
    assert a.use_kl_loss and a.kl_loss_coef == 0.1  # the main job's anchor, on actor rows
    if arm == "actor_only":
        assert not ro.model_path and cfg.trainer.total_training_steps == 16
        return
    assert ro.model_path == mt.TEACHER
    if arm == "design_is":  # the design's defaults, twice the steps for as many actor samples
        assert cfg.trainer.total_training_steps == 32
        assert (sc.type, sc.alpha, sc.per_sample, sc.groups) == ("constant", 0.5, False, "whole")
        assert (ro.fixed_loss, ro.bypass_mode, ro.rollout_is) == ("is", False, "sequence")
        assert ro.rollout_is_threshold == 2.0
        return
    assert (sc.groups, sc.fixed_per_group, sc.alpha) == ("mixed", 1, 0.0)
    assert (ro.fixed_loss, ro.shaping_gamma, ro.shaping_ratio) == ("shaped", 0.1, "ratio")
    new = mt.NEW_ARMS.index(arm) if arm in mt.NEW_ARMS else -1  # they nest: each adds one thing
    assert ro.shaping_normalize == (arm == "mixed_shaped_norm" or new >= 0)
    assert a.loss_agg_mode == ("seq-mean-token-mean" if new >= 0 else "token-mean")
    assert ro.fixed_kl_loss == (new < 0)
    assert cfg.algorithm.adv_estimator == ("grpo_split" if new >= 1 else "grpo")
    assert ro.guided_coef == (1.0 if new == 2 else 0.0) and ro.guided_min_score == 1.0


def test_the_recipe_is_the_main_job_with_the_guided_arms_overrides(tmp_path):
    """configs/mixture_teacher.yaml trains what the benchmark's guided arm measures."""
    common = mt.arm_overrides("guided", 16) + [f"trainer.output_dir={tmp_path}"]
    common.append(f"trainer.rollout_data_dir={tmp_path / 'dumps'}")
    recipe = load_config(TrainConfig, str(mt.RECIPE), common)
    built = load_config(TrainConfig, str(mt.CONFIG), [*mt.RECIPE_OVERRIDES, *common])
    assert as_dict(recipe) == as_dict(built)
    assert mt.config_of("guided") == mt.RECIPE and mt.config_of("shaped_split") == mt.CONFIG


def test_the_sft_arm_is_a_valid_sft_command_line(tmp_path):
    ov = mt.sft_overrides(tmp_path / "t.jsonl", 128, tmp_path / "out", 1)
    cfg = load_config(SFTConfig, str(mt.SFT_CONFIG), ov)
    validate_sft_config(cfg)
    assert cfg.model.path == mt.ACTOR and cfg.model.lora_rank > 0
    assert cfg.trainer.total_training_steps * cfg.data.train_batch_size == 128
    assert cfg.data.train_files == [str(tmp_path / "t.jsonl")]


def test_the_pass4_eval_samples_four_episodes_a_task_at_t1(tmp_path):
    args = mt.eval_args("pass4", tmp_path / "e.json", 3)
    assert args[:4] == ["--samples", "400", "--output", str(tmp_path / "e.json")]
    cfg = load_config(TrainConfig, args[4], args[5:])
    vk = cfg.actor_rollout_ref.rollout.val_kwargs
    assert (vk.n, vk.do_sample, vk.temperature, cfg.trainer.seed) == (4, True, 1.0, 3)
    assert mt.eval_args("greedy", tmp_path / "g.json", 3)[4:] == [str(mt.CONFIG)]


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


def _eval(path: Path, solved: set[int], n: int = 20, tries: int = 1, hits: dict | None = None):
    """An eval JSON of ``n`` tasks; with ``tries`` episodes a task, task i has ``hits[i]``
    successes (default: all of them when i is in ``solved``)."""
    samples = []
    for i in range(n):
        c = (hits or {}).get(i, tries if i in solved else 0)
        samples += [
            {"task_id": f"t{i}", "task_type": "calculator", "reward": float(j < c)}
            for j in range(tries)
        ]
    path.write_text(json.dumps({"num_episodes": len(samples), "samples": samples}))


def test_pass_at_k_is_the_unbiased_estimator_over_each_tasks_episodes(tmp_path):
    _eval(tmp_path / "e.json", set(), n=3, tries=5, hits={0: 0, 1: 1, 2: 3})
    got = mt.pass_at_k(tmp_path / "e.json", 4)
    assert got == pytest.approx({"t0": 0.0, "t1": 1 - 1 / 5, "t2": 1.0})  # C(4,4)/C(5,4) = 1/5
    _eval(tmp_path / "f.json", {1}, n=2, tries=4)
    assert mt.pass_at_k(tmp_path / "f.json") == {"t0": 0.0, "t1": 1.0}
    _eval(tmp_path / "g.json", set(), n=2, tries=3)
    with pytest.raises(ValueError, match="fewer than 4"):
        mt.pass_at_k(tmp_path / "g.json")
    record = json.loads((tmp_path / "f.json").read_text())
    (tmp_path / "h.json").write_text(json.dumps({**record, "num_episodes": 9}))
    with pytest.raises(ValueError, match="--samples"):
        mt.pass_at_k(tmp_path / "h.json")


def _metrics(run: Path, equal_fracs: list[float], using_actor: float | None = None, **per_step):
    run.mkdir(parents=True)
    recs = []
    for step, f in enumerate(equal_fracs, 1):
        r = {"step": step, "batch/size": 40.0, "reward/groups_all_equal_frac": f}
        if using_actor is not None:
            r |= {"rollout/using_actor": using_actor, "rollout/using_fixed": 1 - using_actor}
        r |= {k: v[step - 1] for k, v in per_step.items()}
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
    assert mixed["pass_at_4"] is None and mixed["fixed_grad_share"] is None  # kept before both
    assert base["fixed_grad_share"] == 0.0 and sft["fixed_grad_share"] == 1.0
    assert sft["seeds"] == [0] and sft["gain_vs_actor_only"] == pytest.approx(5.0)
    assert sft["nonzero_adv_group_frac"] is None and sft["sft_unique_examples"] == [51]
    # every other arm against the arm to beat, on the seed both have: seed 0, tasks 0-3 +1, 5 −1
    diffs = [1.0] * 4 + [0.0, -1.0] + [0.0] * 14
    assert mixed["vs_sft_teacher_seeds"] == [0]
    assert mixed["gain_vs_sft_teacher"] == pytest.approx(15.0)
    assert mixed["gain_vs_sft_teacher_se"] == pytest.approx(100 * stdev(diffs) / math.sqrt(20))
    assert base["gain_vs_sft_teacher"] == pytest.approx(-5.0)
    assert mixed["pass_at_4_gain_vs_sft_teacher"] is None  # no pass@4 eval of either
    assert "gain_vs_sft_teacher" not in sft
    assert out["references"]["teacher"]["accuracy"] == pytest.approx(40.0)
    assert out["references"]["teacher"]["pass_at_4"] is None
    json.dumps(out)  # the result file is plain JSON
    for key in ("arm", "seeds", "accuracy", "se", "gain_vs_actor_only", "gain_se", "pass_at_4"):
        assert all(key in a for a in out["arms"])


def test_the_new_arms_report_pass_at_4_and_what_explains_them(tmp_path):
    w = tmp_path
    for s, solved in ((0, set()), (1, {0})):
        _eval(w / f"eval_actor_only_seed{s}.json", set())
        _eval(w / f"eval_pass4_actor_only_seed{s}.json", solved, tries=4)
        _eval(w / f"eval_guided_seed{s}.json", {1})
        _eval(w / f"eval_pass4_guided_seed{s}.json", {1, 2}, tries=4, hits={3: 1})
        _metrics(w / f"guided_seed{s}", [0.5, 0.5], 0.8, **{
            "mixture/fixed_grad_share": [0.4, 0.6 + 0.2 * s],
            "actor/kl_loss": [0.01, 0.03],
            "mixture/rescued_group_frac": [0.25, 0.5],
        })  # fmt: skip
    _eval(w / "eval_teacher.json", {0})
    _eval(w / "eval_pass4_teacher.json", {0, 1}, tries=4)
    _eval(w / "eval_sft_teacher_seed0.json", {1})
    _eval(w / "eval_pass4_sft_teacher_seed0.json", {1}, tries=4)
    out = mt.summarize(w, [0, 1])
    guided = next(a for a in out["arms"] if a["arm"] == "guided")
    # against sft_teacher on seed 0: greedy ties; pass@4 guided also passes tasks 2 and 3
    assert guided["gain_vs_sft_teacher"] == 0.0 and guided["vs_sft_teacher_seeds"] == [0]
    diffs = [0.0, 0.0, 1.0, 1.0] + [0.0] * 16
    assert guided["pass_at_4_gain_vs_sft_teacher"] == pytest.approx(10.0)
    se = 100 * stdev(diffs) / math.sqrt(20)
    assert guided["pass_at_4_gain_vs_sft_teacher_se"] == pytest.approx(se)
    # pass@4 per task: tasks 1, 2 pass; task 3 has 1 of 4 (pass@4 = 1)
    assert guided["pass_at_4"] == pytest.approx(15.0)
    assert guided["pass_at_4_seeds"] == [0, 1]
    # paired: seed 0 +3 tasks; seed 1 the base also passes task 0, which guided does not
    per_task = [0.0] * 20
    per_task[0], per_task[1], per_task[2], per_task[3] = -0.5, 1.0, 1.0, 1.0
    se = math.hypot(stdev(per_task) / math.sqrt(20), stdev([0.15, 0.1]) / math.sqrt(2))
    assert guided["pass_at_4_gain_vs_actor_only"] == pytest.approx(100 * fmean(per_task))
    assert guided["pass_at_4_gain_se"] == pytest.approx(100 * se)
    assert guided["gain_vs_actor_only"] == pytest.approx(5.0)
    assert guided["fixed_grad_share"] == pytest.approx(fmean([0.5, 0.6]))
    sm = guided["step_metrics"]
    assert sm["actor/kl_loss"] == pytest.approx({"mean": 0.02, "median": 0.02})
    assert sm["mixture/rescued_group_frac"]["mean"] == pytest.approx(0.375)
    assert "mixture/is_ess" not in sm  # not logged by this run
    assert out["references"]["teacher"]["pass_at_4"] == pytest.approx(10.0)


def _finished(run: Path, steps: int) -> None:
    ck = run / "checkpoints" / f"global_step_{steps}"
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text("{}")


def _no_run(*args: str, log: Path) -> None:
    raise AssertionError(f"ran toolgrpo {' '.join(args)}")


ARMS = ("actor_only", "design_is", "mixed_shaped", "sft_teacher")


def _old_work(w: Path) -> None:
    """A work directory of the four first arms, seed 0, as a run before pass@4 left it."""
    w.mkdir()
    for name, solved in (("actor_only_seed0", set()), ("design_is_seed0", {1}),
                         ("mixed_shaped_seed0", {0, 1, 2}), ("sft_teacher_seed0", {5}),
                         ("teacher", set(range(8))), ("actor_start", set())):  # fmt: skip
        _eval(w / f"eval_{name}.json", solved)
        record = json.loads((w / f"eval_{name}.json").read_text())
        for s in record["samples"]:
            s["messages"] = [{"role": "user", "content": "What is 2+3?"}]
        (w / f"eval_{name}.json").write_text(json.dumps(record))
        _eval(w / f"eval_pass4_{name}.json", solved, tries=4)
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


def test_a_checkout_with_only_the_kept_copies_resumes_and_reports_the_same(tmp_path, monkeypatch):
    monkeypatch.setattr(mt, "toolgrpo", _no_run)  # every (arm, seed) is done: nothing may run
    w, out = tmp_path / "work", tmp_path / "results" / "mixture_teacher.json"
    _old_work(w)

    def run(work: Path, *extra: str) -> dict:
        argv = ["--seeds", "0", "--steps", "2", "--work", str(work), "--out", str(out)]
        mt.main([*argv, "--arms", *ARMS, *extra])
        result = json.loads(out.read_text())
        assert len(result["arms"]) == 4 and len(result["references"]) == 2
        return result

    full = run(w)  # the full work directory: keeps the copies
    kept = tmp_path / "results" / "mixture_teacher_kept"
    assert (kept / "eval_teacher.json").is_file() and (kept / "setting.json").is_file()
    assert (kept / "eval_pass4_design_is_seed0.json").is_file()
    assert not list(kept.rglob("rollout_data")) and not list(kept.rglob("checkpoints"))
    assert "messages" not in (kept / "eval_sft_teacher_seed0.json").read_text()
    assert "timing" not in (kept / "design_is_seed0" / "metrics.jsonl").read_text()
    assert run(tmp_path / "fresh") == full  # a fresh checkout: every (arm, seed) reused
    assert run(tmp_path / "fresh2", "--report") == full
    assert mt.summarize(tmp_path / "empty", [0], kept) == mt.summarize(w, [0])
    # SFT needs nothing but the kept teacher data: the very successes of the run's dumps
    data, fixed = mt.teacher_data(tmp_path / "empty", kept, 0, 2, tmp_path / "log")
    assert data.parent == kept and fixed == 2
    dumps = w / "mixed_shaped_seed0" / "rollout_data"
    assert [json.loads(x) for x in data.read_text().splitlines()] == mt.teacher_rows(dumps)[0]
    with pytest.raises(SystemExit, match="another setting"):  # kept runs of other --steps
        run(tmp_path / "other", "--steps", "3")


def test_a_kept_greedy_eval_without_pass4_is_trained_again_and_both_measured(tmp_path, monkeypatch):
    """Both measures of an arm describe one checkpoint: no pass@4 of another run's weights."""
    calls = []

    def fake(*args: str, log: Path) -> None:
        calls.append(args[0])
        if args[0] == "train":
            out = Path(
                next(a.split("=", 1)[1] for a in args if a.startswith("trainer.output_dir="))
            )
            _metrics(out, [1.0, 1.0], **{"actor/kl_loss": [0.0, 0.0]})
            _finished(out, 2)
        elif args[0] == "eval":
            tries = 4 if "actor_rollout_ref.rollout.val_kwargs.n=4" in args else 1
            _eval(Path(args[args.index("--output") + 1]), {7}, tries=tries)

    monkeypatch.setattr(mt, "toolgrpo", fake)
    w, out = tmp_path / "work", tmp_path / "results" / "mixture_teacher.json"
    kept = tmp_path / "results" / "mixture_teacher_kept"
    kept.mkdir(parents=True)
    _eval(kept / "eval_actor_only_seed0.json", set())  # an earlier run's greedy eval
    for ref in mt.REFERENCES:
        for name in (f"eval_{ref}.json", f"eval_pass4_{ref}.json"):
            _eval(kept / name, set(), tries=4 if "pass4" in name else 1)
    argv = ["--seeds", "0", "--steps", "2", "--work", str(w), "--out", str(out)]
    mt.main([*argv, "--arms", "actor_only"])
    assert calls == ["train", "eval", "eval"]
    result = json.loads(out.read_text())
    (row,) = result["arms"]
    assert row["accuracy"] == pytest.approx(5.0) and row["pass_at_4"] == pytest.approx(5.0)
    assert mt.summarize(tmp_path / "none", [0], kept)["arms"] == result["arms"]  # replaced
    assert mt.pass_at_k(kept / "eval_pass4_actor_only_seed0.json")["t7"] == 1.0
    calls.clear()
    mt.main([*argv, "--arms", "actor_only"])  # done now: nothing runs again
    assert calls == []
