"""The router inside the trainer on the tiny model: routed prompts, metrics, router-only training,
the actor-optimizer option, checkpoints that restore λ, and a bad families sidecar."""

from __future__ import annotations

import json
import zlib

import pytest
import torch

from tests.conftest import read_metrics
from toolgrpo.config.loader import ConfigError
from toolgrpo.rewards.scoring import Score
from toolgrpo.rollout.render import decode
from toolgrpo.router.prompts import ANSWER_NOTE, ANSWER_NOTE_RLLA
from toolgrpo.trainer import rollout_stage as trainer_mod
from toolgrpo.trainer.trainer import Trainer

ROUTER = {
    "router.enable": "true",
    "router.budget": "0.5",
    "router.dual_lr": "1.0",
    "router.lambda_init": "0.2",
}
REQUIRED = [
    "router/lambda",
    "router/cost/mean",
    "router/task_reward/mean",
    "router/reward/mean",
    "router/route_frac/ANSWER",
    "router/route_frac/SEARCH",
    "router/route_frac/CALCULATE",
    "router/entropy",
    "router/pg_loss",
    "router/label_ce",
]
MT = "actor_rollout_ref.rollout.multi_turn."


def _varied_score(task, text, step, flags):
    v = float(zlib.crc32(text.encode()) % 7) - 3.0
    return Score(v, 0.0, v, 0.0, False, False)


def _capture_plans(trainer: Trainer) -> list:
    plans, orig = [], trainer.router.plan

    def plan(tasks, n, learn=True):
        p = orig(tasks, n, learn)
        plans.append(p)
        return p

    trainer.router.plan = plan
    return plans


def test_router_only_single_turn_run(make_train_config, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_mod, "score", _varied_score)
    out = tmp_path / "run"
    cfg = make_train_config(steps=2, out=out, **ROUTER, **{"router.freeze_lm": "true"})
    trainer = Trainer(cfg)
    plans = _capture_plans(trainer)
    comps = []
    import toolgrpo.trainer.rollout_stage as stage_mod

    orig_rollout = stage_mod.routed_rollout  # the routed single-turn rollout of each plan
    monkeypatch.setattr(
        stage_mod, "routed_rollout", lambda *a: comps.append(orig_rollout(*a)) or comps[-1]
    )
    lm_before = {k: v.clone() for k, v in trainer.policy.model.state_dict().items()}
    head_before = [p.detach().clone() for p in trainer.router.policy.head.parameters()]
    trainer.fit()

    records = read_metrics(out)
    for rec in records:
        for key in REQUIRED:
            assert key in rec, key
        fracs = sum(rec[f"router/route_frac/{r}"] for r in ("ANSWER", "SEARCH", "CALCULATE"))
        assert fracs == pytest.approx(1.0)
    assert records[0]["router/lambda"] == pytest.approx(0.2)  # lambda_init
    assert "actor/pg_loss" not in records[0]  # router-only: the LM is not updated
    for k, v in trainer.policy.model.state_dict().items():
        assert torch.equal(v, lm_before[k]), k
    head = list(trainer.router.policy.head.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(head_before, head, strict=True))

    # Each completion was sampled from its own route's prompt.
    tok = trainer.tokenizer
    for plan, got in zip(plans, comps, strict=True):
        for route, (comp, _, task) in zip(plan.routes, got, strict=True):
            prompt = decode(tok, comp.prompt_ids)
            assert (ANSWER_NOTE in prompt) == (route == "ANSWER"), (route, prompt)
            assert task.messages[1]["content"] in prompt
    # uids group the n rollouts of one task whatever their routes
    assert len({uid for _, uid, _ in comps[0]}) == cfg.data.train_batch_size

    state = torch.load(out / "checkpoints/global_step_2/router.pt", weights_only=False)
    assert state["budget"]["lam"] == pytest.approx(trainer.router.budget.lam)
    assert state["meta"]["routes"] == ["ANSWER", "SEARCH", "CALCULATE"]


def test_resume_restores_lambda_and_head(make_train_config, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_mod, "score", _varied_score)
    out = tmp_path / "run"
    extra = {**ROUTER, "router.freeze_lm": "true", "trainer.save_freq": "1"}
    first = Trainer(make_train_config(steps=2, out=out, **extra))
    first.fit()
    lam, head = first.router.budget.lam, first.router.policy.head.state_dict()
    assert lam != pytest.approx(0.2)  # the dual steps moved it
    again = Trainer(make_train_config(steps=3, out=out, **extra))
    assert again.step == 2 and again.router.budget.lam == pytest.approx(lam)
    for k, v in again.router.policy.head.state_dict().items():
        assert torch.equal(v, head[k])
    again.fit()
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]


def test_the_pi_dual_step_is_wired_and_its_integral_resumes(
    make_train_config, tmp_path, monkeypatch
):
    """router.dual_kp reaches the budget; λ = max(0, I + k_p·e) each step, and a resume restores
    the integral I as well as λ."""
    monkeypatch.setattr(trainer_mod, "score", _varied_score)
    out = tmp_path / "run"
    extra = {**ROUTER, "router.freeze_lm": "true", "trainer.save_freq": "1", "router.dual_kp": "3"}
    first = Trainer(make_train_config(steps=2, out=out, **extra))
    first.fit()
    b = first.router.budget
    assert b.dual_kp == 3.0 and b.integral is not None
    last = read_metrics(out)[-1]
    e = last["router/cost/mean"] - 0.5
    assert b.lam == pytest.approx(max(0.0, b.integral + 3.0 * e))
    again = Trainer(make_train_config(steps=3, out=out, **extra))
    assert again.router.budget.integral == pytest.approx(b.integral)
    assert again.router.budget.lam == pytest.approx(b.lam)


def test_router_on_the_actor_optimizer_with_lm_training(make_train_config, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_mod, "score", _varied_score)
    out = tmp_path / "run"
    extra = {**ROUTER, "router.lr": "null", "trainer.save_freq": "1"}
    trainer = Trainer(make_train_config(steps=1, out=out, **extra))
    assert len(trainer.actor.optimizer.param_groups) == 2
    trainer.fit()
    rec = read_metrics(out)[0]
    assert "actor/pg_loss" in rec and "router/pg_loss" in rec
    again = Trainer(make_train_config(steps=2, out=out, **extra))  # optimizer state reloads
    assert again.step == 1
    again.fit()


def test_multi_turn_episodes_open_with_their_route(make_train_config, tmp_path):
    extra = {
        **ROUTER,
        "router.freeze_lm": "true",
        "data.train_files": "[calculator:train,rlla:train]",
        "data.max_samples": "-1",
        # Some RLLA rows fit 4096 tiny-tokenizer tokens under ANSWER only: drop them (#18 item 5)
        "data.filter_overlong_prompts": "true",
        "data.max_response_length": "24",
        f"{MT}enable": "true",
        f"{MT}max_tokens_per_turn": "8",
    }
    trainer = Trainer(make_train_config(steps=1, out=tmp_path / "run", **extra))
    plans = _capture_plans(trainer)
    played = []
    orig_play = trainer.episodes.play
    trainer.episodes.play = lambda *a, **k: played.append(orig_play(*a, **k)) or played[-1]
    trainer.fit()
    rec = read_metrics(tmp_path / "run")[0]
    for key in REQUIRED:
        assert key in rec
    assert trainer.router.families.family("calculate") == "CALCULATE"  # env tools known
    for plan, episodes in zip(plans, played, strict=True):
        for route, ep in zip(plan.routes, episodes, strict=True):
            system = ep.messages[0]["content"]
            answer = ANSWER_NOTE_RLLA if ep.task_type == "rlla" else ANSWER_NOTE
            assert (answer in system) == (route == "ANSWER")
            if ep.task_type == "calculator":  # SEARCH offers search tools only (the default)
                assert ('"name": "calculate"' in decode(trainer.tokenizer, ep.prompt_ids)) == (
                    route == "CALCULATE"
                )


def test_a_sidecar_naming_unknown_tools_is_refused(make_train_config, tmp_path):
    sidecar = tmp_path / "families.json"
    sidecar.write_text(json.dumps({"f": "SEARCH", "Serch_Web": "SEARCH"}))
    cfg = make_train_config(**ROUTER, **{"router.families_file": str(sidecar)})
    with pytest.raises(ConfigError, match=r"router.families_file=.*'Serch_Web'"):
        Trainer(cfg)


def test_weak_labels_add_a_cross_entropy_term(make_train_config, tmp_path, tiny_data, monkeypatch):
    monkeypatch.setattr(trainer_mod, "score", _varied_score)
    labels = tmp_path / "labels.json"
    examples = {f"{tiny_data}#{i}": ("SEARCH" if i % 2 else "ANSWER") for i in range(8)}
    examples[f"{tiny_data}#0"] = "MIXED"  # no usable label
    labels.write_text(json.dumps({"tools": {"f": "SEARCH"}, "examples": examples}))
    extra = {**ROUTER, "router.label_file": str(labels), "router.label_coeff": "0.5"}
    out = tmp_path / "run"
    trainer = Trainer(make_train_config(steps=2, out=out, **extra))
    trainer.fit()
    recs = read_metrics(out)
    assert all((r["router/label_ce"] > 0) == (r["router/labelled_frac"] > 0) for r in recs)
    assert any(r["router/labelled_frac"] > 0 for r in recs)
    # MIXED carries no usable label; the others index router.routes
    assert [trainer.router._label(t) for t in trainer.tasks[:3]] == [-1, 1, 0]


def test_a_labeler_that_is_down_leaves_training_without_labels(make_train_config, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    extra = {
        **ROUTER,
        "router.labeler.base_url": f"http://127.0.0.1:{port}/v1",
        "router.labeler.model": "m",
        "router.labeler.timeout_s": "2",
        "router.label_coeff": "0.5",
    }
    cfg = make_train_config(steps=1, out=tmp_path / "run", data="rlla:train", **extra)
    trainer = Trainer(cfg)  # RLLA tools to ask about: the first request finds nobody listening
    assert trainer.router.labels is None
    trainer.fit()
    assert read_metrics(tmp_path / "run")[0]["router/label_ce"] == 0.0


def test_a_resume_with_other_route_prompts_is_refused(make_train_config, tmp_path, monkeypatch):
    """Issue 18 item 1: router.pt keeps what shapes the route prompts (tool families after the
    sidecar, family_tools_only, the cost model); a resume that would build other prompts for the
    trained head is refused in one line (main restored the head silently)."""
    from toolgrpo.errors import UserError, one_line
    from toolgrpo.router.spec import SPEC_KEY

    TOOL = "emailvalidation"  # offered by the third RLLA training row
    monkeypatch.setattr(trainer_mod, "score", _varied_score)
    sidecar = tmp_path / "families.json"
    sidecar.write_text(json.dumps({TOOL: "CALCULATE"}))
    out = tmp_path / "run"
    extra = {**ROUTER, "router.freeze_lm": "true", "router.families_file": str(sidecar)}
    extra["data.train_files"] = "[rlla:train]"
    Trainer(make_train_config(steps=1, out=out, **extra)).fit()
    state = torch.load(out / "checkpoints/global_step_1/router.pt", weights_only=True)
    assert state[SPEC_KEY]["families"][TOOL] == "CALCULATE"
    assert state[SPEC_KEY]["family_tools_only"] is True  # the default
    sidecar.write_text(json.dumps({TOOL: "OTHER"}))  # same path, other families
    with pytest.raises(UserError) as err:
        Trainer(make_train_config(steps=2, out=out, **extra))
    assert f"'{TOOL}' CALCULATE -> OTHER" in one_line(err.value) and "\n" not in str(err.value)
    sidecar.write_text(json.dumps({TOOL: "CALCULATE"}))
    with pytest.raises(UserError, match="family_tools_only"):
        Trainer(
            make_train_config(steps=2, out=out, **extra, **{"router.family_tools_only": "false"})
        )
    again = Trainer(make_train_config(steps=2, out=out, **extra))  # as trained: resumes
    assert again.step == 1


@pytest.mark.parametrize(
    "lm_reward, lagrangian, want",
    [
        ("task", "reward", (0.0, 0.0)),  # main: the LM saw r_task alone, tools were free
        ("lagrangian", "reward", (-(0.5**0.5), 0.5**0.5)),  # Z(r − λ·cost), λ = 0.5
        ("lagrangian", "advantage", (-0.5 * 0.5**0.5, 0.5 * 0.5**0.5)),  # Z(r) − λ·Z(cost)
    ],
)
def test_the_lms_reward_carries_the_routers_price(
    make_train_config, tmp_path, monkeypatch, lm_reward, lagrangian, want
):
    """Issue 18 item 2: with router.lm_reward=lagrangian the LM's advantages include the same
    λ·cost as the router's (in the reward or at the advantage level), so a rollout that used a
    tool ranks below one that reached the same task reward without (main: equal, advantage 0)."""
    from itertools import cycle

    from toolgrpo.router.runtime import RouterRuntime
    from toolgrpo.router.usage import ToolUsage

    monkeypatch.setattr(trainer_mod, "score", lambda *a: Score(1.0, 0.0, 1.0, 0.0, True, None))
    used = cycle([ToolUsage({"SEARCH": 1}), ToolUsage()])  # each group: one with a tool, one not
    monkeypatch.setattr(RouterRuntime, "_usage", lambda self, item: next(used))
    extra = {
        **ROUTER,
        "router.lambda_init": "0.5",
        "router.lm_reward": lm_reward,
        "router.lagrangian": lagrangian,
    }
    trainer = Trainer(make_train_config(steps=1, out=tmp_path / "run", **extra))
    seen = []
    orig = trainer.compute_advantages

    def spy(batch, price):  # price: the router's λ·cost, sent with the batch
        m = orig(batch, price)
        seen.append(batch.advantages_BR[:, 0].tolist())
        return m

    trainer.compute_advantages = spy
    trainer.fit()
    adv = seen[0]
    for tool, plain in zip(adv[0::2], adv[1::2], strict=True):
        assert (tool, plain) == pytest.approx(want, abs=1e-4)


def test_no_route_is_cut_where_another_route_of_its_task_is_not(make_train_config, tmp_path):
    """Issue 18 item 5: with data.filter_overlong_prompts=false, main rendered each route's
    prompt with left truncation, so a task's longer routes lost their start while its shorter
    ones did not. Now that is refused in one line; with the filter on such tasks are dropped."""
    from toolgrpo.models.loading import load_tokenizer
    from toolgrpo.rollout.prompts import route_lengths, split_routes
    from toolgrpo.router.families import FamilyMap
    from toolgrpo.router.runtime import RouteCondition

    cfg = make_train_config(**ROUTER)
    tok = load_tokenizer(cfg.actor_rollout_ref.model.path)
    from toolgrpo.data.loader import load_tasks

    tasks = load_tasks(cfg.data.train_files, max_samples=8).tasks
    only = cfg.router.family_tools_only
    conds = [RouteCondition(r, FamilyMap(), only) for r in ("ANSWER", "SEARCH", "CALCULATE")]
    lengths = route_lengths(tok, tasks, None, conds)
    cut = min(max(x) for x in lengths) - 1  # every task's longest route is over, some fit
    assert split_routes(tasks, lengths, cut) and min(min(x) for x in lengths) <= cut
    limit = {"data.max_prompt_length": str(cut)}
    with pytest.raises(ConfigError, match="under some router routes but not others") as err:
        Trainer(make_train_config(**ROUTER, **limit))
    assert "\n" not in str(err.value)
    # With the filter, each task goes by its longest route: here every task has one over.
    on = {**limit, "data.filter_overlong_prompts": "true"}
    with pytest.raises(Exception, match="every prompt exceeds"):
        Trainer(make_train_config(**ROUTER, **on))
