"""``toolgrpo eval`` on environment tasks (issue 16 item 1): episodes played by the trainer's
runner, summarised per task type by one pure function that validation shares."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from tests.conftest import train_overrides, write_jsonl
from toolgrpo.cli import main
from toolgrpo.config.loader import ConfigError, load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.data.loader import embedded_path, load_tasks
from toolgrpo.envs.registry import EnvConfigError
from toolgrpo.eval import multi_turn
from toolgrpo.eval.episodes import binomial_se, summarize_episodes, summary_metrics
from toolgrpo.rollout.episode import Episode
from toolgrpo.trainer.trainer import Trainer


def _ep(task_type, reward, calls=0, errors=None, stop="answer", turns=1, task="t"):
    e = Episode(f"{task}{reward}{calls}", task_type, "u", [1, 2, 3], stop_reason=stop)
    e.append([5, 6], [0.0, 0.0])
    e.append([7], None)
    e.reward, e.num_turns, e.tool_calls = reward, turns, calls
    e.tool_error_types = dict(errors or {})
    e.tool_errors = sum(e.tool_error_types.values())
    return e


def test_summary_per_task_type():
    eps = [
        _ep("calculator", 1.0, calls=2, errors={"parse_error": 1}, turns=3),
        _ep("calculator", 0.0, calls=0, stop="length"),
        _ep("calculator", 1.0, calls=1, turns=2),
        _ep("calculator", 0.0, calls=1, errors={"tool_exception": 1}, stop="max_turns"),
        _ep("search", 0.5, calls=1),  # F1 0.5: partly right is not accurate
        _ep("search", 1.0, calls=2, errors={"parse_error": 2}),
    ]
    s = summarize_episodes(eps)
    c = s["calculator"]
    assert c["episodes"] == 4 and c["accuracy"] == 0.5
    assert c["accuracy_se"] == pytest.approx(math.sqrt(0.25 / 4))
    assert c["tool_call_rate"] == 0.75 and c["calls_per_episode"] == 1.0
    assert c["tool_error_rate"] == 0.5  # 2 errors in 4 calls
    assert c["tool_errors"] == {
        "parse_error": {"count": 1, "rate": 0.25},
        "tool_exception": {"count": 1, "rate": 0.25},
    }
    assert c["stop_reasons"] == {"answer": 0.5, "length": 0.25, "max_turns": 0.25}
    assert c["turns_mean"] == 1.75 and c["sampled_tokens_mean"] == 2
    assert c["response_tokens_mean"] == 3 and c["prompt_tokens_mean"] == 3
    assert s["search"]["accuracy"] == 0.5 and s["search"]["tool_error_rate"] == 2 / 3
    a = s["all"]
    assert a["episodes"] == 6 and a["accuracy"] == pytest.approx(3 / 6)
    assert a["type_mean_accuracy"] == 0.5
    m = summary_metrics(s)
    assert m["val/calculator/accuracy"] == 0.5
    assert m["val/calculator/tool_errors/parse_error/rate"] == 0.25
    assert m["val/search/stop/answer"] == 1.0


def test_rlla_success_is_its_exact_call_or_format_part():
    tool, resp, wrong = _ep("rlla", 3.5), _ep("rlla", 0.5), _ep("rlla", 4.0)
    tool.reward_parts = {"exact_call": 1.0, "format_ok": 1.0}
    resp.reward_parts = {"format_ok": 1.0}
    wrong.reward_parts = {"exact_call": 0.0, "format_ok": 1.0}
    assert summarize_episodes([tool, resp, wrong])["rlla"]["accuracy"] == pytest.approx(2 / 3)


def test_nonfinite_reward_is_not_accurate_and_se_bounds():
    assert summarize_episodes([_ep("x", float("nan"))])["x"]["accuracy"] == 0.0
    assert binomial_se(0.5, 100) == 0.05 and binomial_se(0.0, 10) == 0.0 and binomial_se(1, 0) == 0


@pytest.fixture(scope="module")
def env_val_file(tmp_path_factory):
    """Two tasks each of calculator, search and direct, from their test splits."""
    rows = []
    for env in ("calculator", "search", "direct"):
        lines = embedded_path(f"{env}_test.jsonl", "envs").read_text().splitlines()
        rows += [json.loads(x) for x in lines[:2]]
    return write_jsonl(tmp_path_factory.mktemp("val") / "env_val.jsonl", rows)


def _overrides(model_dir, val, out):
    return train_overrides(
        model_dir,
        val,
        out,
        1,
        **{
            "data.max_response_length": 24,
            "actor_rollout_ref.rollout.multi_turn.enable": "true",
            "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn": 8,
            "actor_rollout_ref.rollout.generation_batch_size": 4,
        },
    )


def test_eval_plays_env_tasks_and_agrees_with_validation(tiny_model_dir, env_val_file, tmp_path):
    """Pins: ``toolgrpo eval`` could not score calculator/search/direct tasks (it sent them to
    the single-turn RLLA scorer); now its numbers equal ``Trainer.validate``'s exactly."""
    ov = _overrides(tiny_model_dir, env_val_file, tmp_path / "run")
    out = tmp_path / "eval.json"
    assert main(["eval", "--output", str(out), "--samples", "1", *ov]) == 0
    res = json.loads(out.read_text())
    assert res["mode"] == "episodes" and res["num_episodes"] == 6
    assert set(res["summary"]) == {"calculator", "search", "direct", "all"}
    assert [s["task_type"] for s in res["samples"]] == ["calculator", "search", "direct"]
    assert res["samples"][0]["messages"][0]["role"] == "system"
    assert res["sampling"]["do_sample"] is False
    trainer = Trainer(load_config(TrainConfig, None, ov))
    try:
        val = trainer.validate(0)
    finally:
        trainer.close()
    assert res["metrics"] and {k: val[k] for k in res["metrics"]} == res["metrics"]


def test_eval_checks_before_loading_the_model(tiny_model_dir, env_val_file, tmp_path, monkeypatch):
    """A head asked for but missing, or a task type without an environment: refused before any
    model is loaded."""

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(multi_turn, "load_policy", no_model)
    ov = _overrides(tiny_model_dir, env_val_file, tmp_path / "run")
    cfg = load_config(TrainConfig, None, [*ov, "router.enable=true"])
    tasks = load_tasks([str(env_val_file)]).tasks
    with pytest.raises(ConfigError, match="router.enable=false"):
        multi_turn.run_episode_eval(cfg, tasks, "m", tmp_path / "e.json", 0)
    cfg = load_config(TrainConfig, None, ov)
    odd = [replace(tasks[0], task_type="no_such_env")]
    with pytest.raises(EnvConfigError, match="no_such_env"):
        multi_turn.run_episode_eval(cfg, odd, "m", tmp_path / "e.json", 0)


def test_routed_eval_of_a_router_checkpoint_agrees_with_validation(
    tiny_model_dir, env_val_file, tmp_path
):
    """A checkpoint with a router head: eval plays each task under the head's routes as
    validation does, and both report the same numbers (route shares included)."""
    ov = _overrides(tiny_model_dir, env_val_file, tmp_path / "run")
    ov += ["router.enable=true", "router.freeze_lm=true", "data.max_samples=-1"]
    trainer = Trainer(load_config(TrainConfig, None, ov))
    try:
        trainer.fit()
        val = trainer.validate(1)
    finally:
        trainer.close()
    ckpt = tmp_path / "run" / "checkpoints" / "global_step_1"
    assert (ckpt / "router.pt").is_file()
    out = tmp_path / "eval.json"
    assert main(["eval", "--output", str(out), "--checkpoint", str(ckpt), *ov]) == 0
    res = json.loads(out.read_text())
    assert res["routed"] and set(res["summary"]["all"]["routes"]) <= {
        "ANSWER",
        "SEARCH",
        "CALCULATE",
    }
    assert sum(res["summary"]["all"]["routes"].values()) == pytest.approx(1.0)
    assert any("/route/" in k for k in res["metrics"])
    assert {k: val[k] for k in res["metrics"]} == res["metrics"]
    answer = [s for s in res["samples"] if s["route"] == "ANSWER"]
    for s in answer:  # an ANSWER-routed episode opens without tools
        assert "<tools>" not in s["messages"][0]["content"]
    # Issue 18 item 1: cost vs budget per task type and the fixed-route baselines, in the same
    # report (main reported route shares only).
    sel = res["routing"]["selections"]
    assert set(sel) == {
        "router",
        "router_sampled",
        "router_argmax",
        "router_threshold",
        "always_answer",
        "always_family",
        "best_in_hindsight",
    }
    assert res["routing"]["budget"] == pytest.approx(0.3)
    # The budget binds (B = 0.3 < 1): the headline is the sampled policy, the argmax has its own
    # name, and the threshold (calibrated on these tasks: the checkpoint was saved before any
    # validation) spends at most B (unless even ANSWER everywhere spent more: τ = ∞ then).
    assert res["routing"]["headline"] == "router_sampled" and sel["router"] == sel["router_sampled"]
    answer_cost = sel["always_answer"]["all"]["cost_mean"]
    assert res["routing"]["threshold"]["feasible"] == (answer_cost <= 0.3 + 1e-9)
    assert sel["router_threshold"]["all"]["cost_mean"] <= max(0.3, answer_cost) + 1e-9
    assert res["routing"]["threshold"]["source"].startswith("calibrated on these tasks")
    for t in ("calculator", "search", "direct", "all"):
        assert sel["router"][t]["cost_minus_budget"] == pytest.approx(
            sel["router"][t]["cost_mean"] - 0.3
        )
        best = sel["best_in_hindsight"][t]["reward_mean"]
        assert all(best >= sel[k][t]["reward_mean"] - 1e-9 for k in sel)
    assert sel["always_answer"]["all"]["route_frac"] == {"ANSWER": 1.0}
    # The sampled policy mixes the routes by the head's probabilities: its route shares are a
    # distribution, and no mixture beats the best route per task.
    for t in ("calculator", "search", "direct", "all"):
        mixed = sel["router_sampled"][t]
        assert sum(mixed["route_frac"].values()) == pytest.approx(1.0)
        assert mixed["reward_mean"] <= sel["best_in_hindsight"][t]["reward_mean"] + 1e-9
    assert "val/sampled/all/cost_mean" in res["metrics"]
    fam = {t: sel["always_family"][t]["route_frac"] for t in ("calculator", "search", "direct")}
    assert fam == {
        "calculator": {"CALCULATE": 1.0},
        "search": {"SEARCH": 1.0},
        "direct": {"ANSWER": 1.0},
    }
    assert "val/calculator/cost_minus_budget" in res["metrics"]
    assert "val/baseline/best_in_hindsight/all/reward_mean" in res["metrics"]


def test_router_enable_without_a_head_is_refused(tiny_model_dir, env_val_file, tmp_path, capsys):
    ov = _overrides(tiny_model_dir, env_val_file, tmp_path / "run")
    rc = main(["eval", "--output", str(tmp_path / "e.json"), *ov, "router.enable=true"])
    assert rc != 0 and "router.enable=true but no --checkpoint given" in capsys.readouterr().err
    ckpt = tiny_model_dir  # a model directory: no router head in it
    rc = main(
        ["eval", "--checkpoint", str(ckpt), "--output", str(tmp_path / "e.json"), *ov]
        + ["router.enable=true"]
    )
    assert rc != 0 and f"{ckpt} has no router.pt" in capsys.readouterr().err
