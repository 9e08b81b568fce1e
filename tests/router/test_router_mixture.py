"""The router beside a fixed rollout policy (the mixture): every rollout is routed, but the head,
λ's cost window and the price scale learn from the actor's own rollouts only; the fixed
policy's are another LM's outcomes. The LM still trains on every row at the step's price."""

from __future__ import annotations

import pytest

from tests.conftest import read_metrics
from tests.mixture.test_mixed_groups_trainer import _varied_score
from toolgrpo.trainer import rollout_stage as stage_mod
from toolgrpo.trainer.trainer import Trainer


def test_the_head_and_lambda_learn_from_the_actors_rollouts_only(
    make_train_config, tiny_model_dir, tmp_path, monkeypatch
):
    """Whole groups (mixed groups are refused with the router), drawn per group: a step's
    parts are the actor's groups and the fixed policy's."""
    monkeypatch.setattr(stage_mod, "score", _varied_score)
    out = tmp_path / "run"
    extra = {
        "router.enable": "true",
        "router.budget": "0.5",
        "rollout_only.model_path": str(tiny_model_dir),
        "rollout_allocation_schedule.alpha": "0.5",
        "rollout_allocation_schedule.per_sample": "true",
        "data.train_batch_size": "4",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "4",
        "trainer.save_freq": "-1",
    }
    trainer = Trainer(make_train_config(steps=3, out=out, **extra))
    rt = trainer.router
    plans, learned, priced, lm_rows = [], [], [], []
    plan, update, observe = rt.plan, rt.policy.update, rt.budget.observe

    def spy_plan(tasks, n, learn=True):
        plans.append((len(tasks) * n, learn))
        return plan(tasks, n, learn)

    def spy_update(features, actions, *a, **k):
        learned.append(actions.numel())
        return update(features, actions, *a, **k)

    def spy_observe(costs):
        priced.append(len(costs))
        return observe(costs)

    rt.plan, rt.policy.update, rt.budget.observe = spy_plan, spy_update, spy_observe
    bind = rt.bind_rows
    rt.bind_rows = lambda rows: lm_rows.append(len(rows)) or bind(rows)
    trainer.fit()

    actor, every, i = [], [], 0
    for rec in read_metrics(out):  # one part a step, or two when both policies drew groups
        parts = 1 if rec["rollout/using_fixed"] in (0.0, 1.0) else 2
        actor.append(sum(k for k, learn in plans[i : i + parts] if learn))
        every.append(sum(k for k, _ in plans[i : i + parts]))
        i += parts
    assert i == len(plans)
    assert any(not learn for _, learn in plans), plans  # a fixed policy played some groups
    assert priced == actor  # λ's cost window: the actor's rollouts
    assert learned == [a for a in actor if a]  # the head: the same rows (no step without any)
    assert lm_rows == every  # the LM is priced on every row it trains on
    for rec, a, e in zip(read_metrics(out), actor, every, strict=True):
        assert rec["router/learned_frac"] == pytest.approx(a / e)
        assert rec["router/pg_loss"] == rec["router/pg_loss"]  # finite, logged every step
