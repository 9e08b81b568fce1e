"""benchmarks/main_job_seeds.py: per-seed paired gains and the pooled SE, on hand-made eval files
shaped like ``toolgrpo eval``'s JSON (episodes for the held-out set, samples for RLLA), and a
checkout holding only the kept copies resuming (nothing re-run) with the same result."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path
from statistics import fmean, stdev

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import main_job_seeds as mjs  # noqa: E402
from main_job_seeds import summarize  # noqa: E402
from seed_stats import two_way_se  # noqa: E402

TYPES = ("calculator", "search")


def _env(path: Path, solved: set[int], n: int = 20, talk: bool = False) -> None:
    samples = [
        {
            "task_id": f"t{i}",
            "task_type": TYPES[i % 2],
            "reward": 1.0 if i in solved else 0.0,
            "tool_errors": {"exception": 1} if talk and i % 3 == 0 else {},
        }
        for i in range(n)
    ]
    for s in samples if talk else []:  # the conversation, as toolgrpo eval keeps it
        s["messages"] = [{"role": "user", "content": "What is 2+3?"}]
    path.write_text(json.dumps({"num_episodes": n, "samples": samples}))


def _rlla(path: Path, totals: list[float], talk: bool = False) -> None:
    samples = [{"task_id": f"r{i}", "total": t} for i, t in enumerate(totals)]
    for s in samples if talk else []:
        s["response"] = "<tool_call>...</tool_call>"
    path.write_text(json.dumps({"num_tasks": len(totals), "samples": samples}))


def _schemas(path: Path, valid: set[int], correct: set[int], n: int = 8) -> None:
    samples = [
        {
            "task_id": f"s{i}",
            "task_type": ("schemas", "schemas_rlla")[i % 2],
            "reward": 1.0 if i in correct else 0.25 * (i in valid),
            "reward_parts": {
                "format_valid": float(i in valid),
                "names_ok": float(i in correct),
                "correct": float(i in correct),
            },
        }
        for i in range(n)
    ]
    path.write_text(json.dumps({"num_episodes": n, "samples": samples}))


def _all_schemas(d: Path) -> None:
    _schemas(d / "eval_schemas_warmstart.json", {0, 1, 2, 3, 4, 5}, {0, 1})
    _schemas(d / "eval_schemas_seed_0.json", {0, 1, 2}, {0})  # lost 3 valid, 1 correct
    _schemas(d / "eval_schemas_seed_1.json", {0, 1, 2, 3, 4, 5, 6}, {0, 1, 6})


def test_the_unseen_tools_eval_is_paired_per_seed_per_style_and_pooled(tmp_path):
    _env(tmp_path / "eval_env_warmstart.json", {0, 1})
    for s in (0, 1):
        _env(tmp_path / f"eval_env_seed_{s}.json", {0, 1})
        _rlla(tmp_path / f"eval_rlla_seed_{s}.json", [0.0])
    _rlla(tmp_path / "eval_rlla_warmstart.json", [0.0])
    _all_schemas(tmp_path)
    out = summarize(tmp_path, [0, 1])
    s0, s1 = out["seeds"]
    assert s0["schemas_before"] == {"format_valid": 75.0, "names_ok": 25.0, "correct": 25.0}
    assert s0["schemas_after"] == {"format_valid": 37.5, "names_ok": 12.5, "correct": 12.5}
    assert s0["schemas_diff"] == {"format_valid": -37.5, "names_ok": -12.5, "correct": -12.5}
    assert s1["schemas_diff"]["format_valid"] == 12.5 and s1["schemas_diff"]["correct"] == 12.5
    # per style: even ids are native (0, 2, 4, 6), odd ones RLLA
    assert s0["schemas_by_style"]["schemas"]["format_valid"]["diff"] == -25.0
    assert s0["schemas_by_style"]["schemas_rlla"]["format_valid"]["diff"] == -50.0
    sd = stdev([0, 0, 0, -1.0, -1.0, -1.0, 0, 0]) * 100 / math.sqrt(8)
    assert math.isclose(s0["schemas_se"]["format_valid"], sd)
    p = out["pooled"]
    assert math.isclose(p["schemas_diff"]["format_valid"], -12.5)
    assert math.isclose(p["schemas_diff"]["correct"], 0.0)
    assert p["schemas_se"]["format_valid"] > 0 and p["schemas_before"]["correct"] == 25.0


def test_gains_are_paired_by_task_and_the_pooled_se_adds_both_sources(tmp_path):
    _all_schemas(tmp_path)
    _env(tmp_path / "eval_env_warmstart.json", {0, 1, 2, 3})
    _env(tmp_path / "eval_env_seed_0.json", {0, 1, 2, 3, 4, 5, 6, 7})  # +4 of 20
    _env(tmp_path / "eval_env_seed_1.json", {1, 2, 3, 8})  # one lost, one gained
    _rlla(tmp_path / "eval_rlla_warmstart.json", [0.0, 1.0, -1.0, 2.0])
    _rlla(tmp_path / "eval_rlla_seed_0.json", [0.0, 0.0, -1.0, 2.0])
    _rlla(tmp_path / "eval_rlla_seed_1.json", [1.0, 1.0, -1.0, 2.0])
    (tmp_path / "overrides.json").write_text('["actor_rollout_ref.actor.optim.lr=5e-5"]')
    out = summarize(tmp_path, [0, 1, 2])  # seed 2 has no evals yet: left out
    s0, s1 = out["seeds"]
    assert (s0["seed"], s0["gain"], s0["up"], s0["down"]) == (0, 20.0, 4, 0)
    assert (s1["seed"], s1["gain"], s1["up"], s1["down"]) == (1, 0.0, 1, 1)
    assert s0["rlla_diff"] == -0.25 and s1["rlla_diff"] == 0.25
    assert out["overrides"] == ["actor_rollout_ref.actor.optim.lr=5e-5"]
    # each task's gain averaged over the two seeds, then the SE over the 20 tasks
    per_task = [0.0] * 20
    for i in (4, 5, 6, 7, 8):
        per_task[i] += 0.5
    per_task[0] -= 0.5
    se_tasks = 100 * stdev(per_task) / math.sqrt(20)
    se_seeds = stdev([20.0, 0.0]) / math.sqrt(2)
    p = out["pooled"]
    assert math.isclose(p["gain"], 100 * fmean(per_task)) and math.isclose(p["gain"], 10.0)
    assert math.isclose(p["se_over_tasks"], se_tasks)
    assert math.isclose(p["se_between_seeds"], se_seeds)
    assert math.isclose(p["se_conservative"], math.hypot(se_tasks, se_seeds))
    # the two-way SE drops the seed-by-task noise counted twice above: between the two
    assert se_tasks < p["se"] < p["se_conservative"]
    assert math.isclose(p["z"], p["gain"] / p["se"])
    assert p["seeds"] == 2 and p["tasks"] == 20


def _no_run(*args: str, log: Path) -> None:
    raise AssertionError(f"ran toolgrpo {' '.join(args)}")


def test_a_checkout_with_only_the_kept_copies_resumes_and_reports_the_same(tmp_path, monkeypatch):
    monkeypatch.setattr(mjs, "toolgrpo", _no_run)  # every seed is done: nothing may run
    monkeypatch.setattr(mjs, "plot", lambda result, path: None)
    here = {"cpu_flags": ["avx2", "amx_bf16"], "dtype": "bfloat16", "cores": 2}
    monkeypatch.setattr(mjs, "machine", lambda: here)
    work, out = tmp_path / "work", tmp_path / "results" / "main_job_seeds"
    work.mkdir()
    _env(work / "eval_env_warmstart.json", {0, 1, 2, 3}, talk=True)
    _env(work / "eval_env_seed_0.json", {0, 1, 2, 3, 4, 5}, talk=True)
    _env(work / "eval_env_seed_1.json", {1, 2, 3, 8}, talk=True)
    _rlla(work / "eval_rlla_warmstart.json", [0.0, 1.0, -1.0, 2.0], talk=True)
    _rlla(work / "eval_rlla_seed_0.json", [0.0, 0.0, -1.0, 2.0], talk=True)
    _rlla(work / "eval_rlla_seed_1.json", [1.0, 1.0, -1.0, 2.0], talk=True)
    _all_schemas(work)
    # seed 0's finished run: its metrics (a few keys kept) give the seed's training summary
    ck = work / "seed_0" / "checkpoints" / f"global_step_{mjs.STEPS}"
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text("{}")
    rows = [{"step": 0, "val/all/accuracy": 0.4, "timing/step_s": 9.0}]
    rows += [{"step": i, "timing/step_s": 60.0 + i, "rollout/mismatch_kl": 1e-3, "big": [0] * 9}
             for i in (1, 2)]  # fmt: skip
    rows += [{"step": 2, "val/all/accuracy": 0.5}]
    (work / "seed_0" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lr = "actor_rollout_ref.actor.optim.lr=5e-5"

    def run(w: Path, *extra: str) -> dict:
        mjs.main(["--seeds", "0", "1", "--work", str(w), "--out", str(out), *extra])
        return json.loads(out.with_suffix(".json").read_text())

    full = run(work, lr)  # the full work directory: keeps the copies
    kept = tmp_path / "results" / "main_job_seeds_kept"
    names = sorted(p.name for p in kept.iterdir())
    evals = [p.name for p in work.glob("e*")]
    assert names == sorted(["setting.sha256", "overrides.json", "seed_0", *evals])
    assert "big" not in (kept / "seed_0" / "metrics.jsonl").read_text()
    t0 = full["seeds"][0]["training"]
    assert t0 == {"timing/step_s": 61.5, "rollout/mismatch_kl": 1e-3,
                  "val_accuracy": {"0": 0.4, "2": 0.5}}  # fmt: skip
    assert full["seeds"][1]["training"] == {}  # no run at hand
    # the machine seed 0 trained on is kept beside its metrics; seed 1 has none recorded
    assert full["seeds"][0]["machine"] == here and "machine" not in full["seeds"][1]
    assert json.loads((kept / "seed_0" / "machine.json").read_text()) == here
    assert not any(("messages" in p.read_text() or "response" in p.read_text()) for p in
                   kept.glob("*.json"))  # fmt: skip
    assert [r["seed"] for r in full["seeds"]] == [0, 1] and full["overrides"] == [lr]
    assert run(tmp_path / "fresh", lr) == full  # a fresh checkout: every seed reused
    assert run(tmp_path / "fresh2", "--report") == full
    assert mjs.summarize(tmp_path / "empty", [0, 1], kept) == mjs.summarize(work, [0, 1])
    with pytest.raises(SystemExit, match="another setting"):  # kept runs of other overrides
        run(tmp_path / "other", "actor_rollout_ref.actor.optim.lr=1e-4")
    (kept / "setting.sha256").write_text("0" * 64 + "\n")  # ... or of another config
    with pytest.raises(SystemExit, match="another setting"):
        run(tmp_path / "other2", lr)


def test_two_way_se_is_exact_without_interaction_and_unbiased_under_the_model():
    # outcome = task effect + seed effect, no noise: no double counting to remove, so the
    # two-way variance equals the sum of the two SEs' squares
    tasks, seeds = [0.0, 1.0, 0.0, 1.0, 1.0], [0.0, 0.5, -0.2]
    cells = [[a + b for b in seeds] for a in tasks]
    t_means = [fmean(r) for r in cells]
    s_means = [fmean(r[j] for r in cells) for j in range(3)]
    want = stdev(t_means) ** 2 / 5 + stdev(s_means) ** 2 / 3
    assert math.isclose(two_way_se(cells) ** 2, want)
    # under d = a_task + u_seed + e, the mean of the estimated variance matches the spread of
    # the grand mean over repeats (the summed SE overshoots by var(e) / (S T))
    rng, n_t, n_s = random.Random(0), 40, 3
    grand, est, summed = [], [], []
    for _ in range(3000):
        a = [rng.gauss(0, 1.0) for _ in range(n_t)]
        u = [rng.gauss(0, 0.3) for _ in range(n_s)]
        cells = [[a[i] + u[j] + rng.gauss(0, 1.5) for j in range(n_s)] for i in range(n_t)]
        grand.append(fmean(x for r in cells for x in r))
        est.append(two_way_se(cells) ** 2)
        tm = [fmean(r) for r in cells]
        sm = [fmean(r[j] for r in cells) for j in range(n_s)]
        summed.append(stdev(tm) ** 2 / n_t + stdev(sm) ** 2 / n_s)
    true = 1.0 / n_t + 0.09 / n_s + 2.25 / (n_t * n_s)
    assert abs(stdev(grand) ** 2 / true - 1) < 0.1  # the simulation is what the model says
    assert abs(fmean(est) / true - 1) < 0.06
    assert fmean(summed) / true > 1.1


def _fake_cli(calls: list[tuple[str, ...]], steps: int):
    """``toolgrpo`` as the benchmark calls it: a train run writes its last checkpoint and
    metrics; an eval writes its JSON (the trained model solves more held-out tasks)."""

    def fake(*args: str, log: Path) -> None:
        calls.append(args)
        if args[0] == "train":
            run = Path(next(a for a in args if a.startswith("trainer.output_dir=")).split("=")[1])
            ck = run / "checkpoints" / f"global_step_{steps}"
            ck.mkdir(parents=True)
            (ck / "trainer_state.json").write_text("{}")
            rows = [{"step": i, "timing/step_s": 5.0, "perf/peak_rss_gb": g}
                    for i, g in ((1, 2.5), (2, 3.25), (3, 3.0))]  # fmt: skip
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            return
        out = Path(args[args.index("--output") + 1])
        trained = "--checkpoint" in args
        if out.name.startswith("eval_env"):
            _env(out, {0, 1, 2, 3, 4} if trained else {0, 1})
        elif out.name.startswith("eval_rlla"):
            _rlla(out, [0.0, 1.0])
        else:
            _schemas(out, {0, 1}, {0})

    return fake


def _other_config(tmp_path: Path) -> Path:
    text = mjs.CONFIG.read_text()
    text = text.replace("total_training_steps: 16", "total_training_steps: 3")
    text = text.replace("path: smollm2-135m-agent", "path: other-model\n    adapter_path: ad/x")
    config = tmp_path / "agent_other.yaml"
    config.write_text(text)
    return config


def test_another_config_trains_its_own_steps_and_the_rlla_eval_scores_its_model(
    tmp_path, monkeypatch
):
    """``--config``: every seed trains that config to its own last step, the env and unseen-tools
    evals read it, and the RLLA eval scores its model (path and adapter), not SmolLM2's."""
    config = _other_config(tmp_path)
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(mjs, "toolgrpo", _fake_cli(calls, 3))
    monkeypatch.setattr(mjs, "plot", lambda result, path: None)
    out = tmp_path / "results" / "main_job_other"
    mjs.main(["--config", str(config), "--seeds", "0", "--work", str(tmp_path / "w"),
              "--out", str(out)])  # fmt: skip
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["steps"] == 3 and result["config"] == str(config)
    assert result["warm_start_accuracy"] == pytest.approx(10.0)  # 2 of 20
    assert result["seeds"][0]["gain"] == pytest.approx(15.0)
    assert result["seeds"][0]["training"]["peak_rss_gb"] == 3.25  # the largest step's
    train = [c for c in calls if c[0] == "train"]
    assert len(train) == 1 and train[0][1] == str(config)
    rlla = [c for c in calls if c[0] == "eval" and "eval_rlla" in " ".join(c)]
    assert (
        all(
            str(mjs.RLLA_CONFIG) in c
            and "actor_rollout_ref.model.path=other-model" in c
            and "actor_rollout_ref.model.adapter_path=ad/x" in c
            for c in rlla
        )
        and len(rlla) == 2
    )
    env = [c for c in calls if c[0] == "eval" and "eval_env" in " ".join(c)]
    assert all(str(config) in c for c in env) and len(env) == 2
    assert mjs.Job().rlla_model() == []  # the default config's RLLA eval is unchanged


def test_evals_env_runs_the_held_out_eval_alone_and_reports_without_rlla(tmp_path, monkeypatch):
    """``--evals env``: no RLLA or unseen-tools eval runs; each seed reports its held-out gain
    and training, without RLLA or schemas fields."""
    config = _other_config(tmp_path)
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(mjs, "toolgrpo", _fake_cli(calls, 3))
    monkeypatch.setattr(mjs, "plot", lambda result, path: None)
    out = tmp_path / "results" / "main_job_other"
    mjs.main(["--config", str(config), "--seeds", "0", "1", "--work", str(tmp_path / "w"),
              "--out", str(out), "--evals", "env"])  # fmt: skip
    evals = [" ".join(c) for c in calls if c[0] == "eval"]
    assert len(evals) == 3 and all("eval_env_" in c for c in evals)
    result = json.loads(out.with_suffix(".json").read_text())
    assert [r["seed"] for r in result["seeds"]] == [0, 1]
    for r in result["seeds"]:
        assert r["gain"] == pytest.approx(15.0) and r["training"]["peak_rss_gb"] == 3.25
        assert not any(k.startswith(("rlla", "schemas")) for k in r)
    assert "rlla_diff" not in result["pooled"] and result["pooled"]["seeds"] == 2


def test_a_record_of_more_than_three_seeds_keeps_the_first_threes_pool(tmp_path):
    """Seeds added to the record (the first three's pool stays reported beside the new one)."""
    _env(tmp_path / "eval_env_warmstart.json", {0, 1, 2, 3})
    for s, solved in enumerate(({0, 1, 2, 3, 4, 5}, {1, 2, 3, 8}, {0, 1, 2, 3, 9}, {0, 5, 6})):
        _env(tmp_path / f"eval_env_seed_{s}.json", solved)
    three, four = summarize(tmp_path, [0, 1, 2]), summarize(tmp_path, [0, 1, 2, 3])
    assert "pooled_first_three" not in three
    assert four["pooled"]["seeds"] == 4 and four["pooled"]["gain"] != three["pooled"]["gain"]
    assert four["pooled_first_three"] == {k: three["pooled"][k] for k in four["pooled_first_three"]}
    assert four["pooled_first_three"]["seeds"] == 3


def test_a_run_keeps_the_machine_it_trained_on_not_the_one_that_reports(tmp_path, monkeypatch):
    monkeypatch.setattr(mjs, "machine", lambda: {"cpu_flags": ["avx2"]})  # the reporting one
    work, kept = tmp_path / "work", tmp_path / "kept"
    ck = work / "seed_3" / "checkpoints" / f"global_step_{mjs.STEPS}"
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text("{}")
    (work / "seed_3" / "metrics.jsonl").write_text('{"step": 1, "timing/step_s": 9.0}\n')
    trained_on = {"cpu_flags": ["avx2", "avx512_bf16"], "dtype": "bfloat16"}
    (work / mjs.machine_name(3)).write_text(json.dumps(trained_on))
    mjs.keep_metrics(work, kept, 3)
    assert json.loads((kept / mjs.machine_name(3)).read_text()) == trained_on
    mjs.keep_metrics(work, kept, 4)  # no finished run: nothing kept, nothing recorded
    assert not (kept / "seed_4").exists() and not (work / "seed_4").exists()
