"""The fixed rows' options inside the trainer, on tiny models: the on-policy baseline
(grpo_split), the KL loss without fixed rows, the guided NLL on fixed successes, and the metrics
every arm logs to explain itself (the fixed rows' share of the update's gradient weight)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.conftest import read_metrics
from tests.mixture.test_mixed_groups_trainer import _capture, _varied_score
from toolgrpo.algos.grpo_split import compute_grpo_split_advantages
from toolgrpo.config.loader import ConfigError
from toolgrpo.trainer import actor as actor_mod
from toolgrpo.trainer import rollout_stage
from toolgrpo.trainer.trainer import Trainer

MIXED = {
    "rollout_allocation_schedule.groups": "mixed",
    "rollout_allocation_schedule.alpha": 0.0,  # every group gets a fixed sample
    "rollout_allocation_schedule.fixed_per_group": 1,
    "rollout_only.fixed_loss": "shaped",
    "actor_rollout_ref.actor.use_kl_loss": "true",
}
# The recipe's options (configs/mixture_teacher.yaml) on the tiny run.
RECIPE = {
    "rollout_only.shaping_normalize": "true",
    "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
    "rollout_only.fixed_kl_loss": "false",
    "algorithm.adv_estimator": "grpo_split",
    "rollout_only.guided_coef": 1.0,
    "rollout_only.guided_min_score": 0.0,  # scores are -3..3: about half the fixed rows
}


@pytest.fixture(autouse=True)
def _scores(monkeypatch):
    monkeypatch.setattr(rollout_stage, "score", _varied_score)


@pytest.fixture
def mix_config(make_train_config, tiny_fixed_dir):
    def make(steps=1, out=None, **extra):
        base = {"rollout_only.model_path": str(tiny_fixed_dir), "trainer.save_hf_model": "false"}
        return make_train_config(steps=steps, out=out, **{**base, **MIXED, **extra})

    return make


def test_the_recipes_options_reach_the_update_and_explain_themselves(
    mix_config, tmp_path, monkeypatch
):
    kl_rows, nll_rows = [], []
    orig_kl = actor_mod.kl_loss

    def kl_spy(*args):
        kl_rows.append(args[-1])
        return orig_kl(*args)

    monkeypatch.setattr(actor_mod, "kl_loss", kl_spy)
    from toolgrpo.mixture import objective

    orig_nll = objective.guided_nll_loss

    def nll_spy(lp, mask, rows, coef, agg, scale):
        nll_rows.append(rows.clone())
        return orig_nll(lp, mask, rows, coef, agg, scale)

    monkeypatch.setattr(objective, "guided_nll_loss", nll_spy)
    out = tmp_path / "recipe"
    trainer = Trainer(mix_config(steps=2, out=out, **RECIPE))
    seen = _capture(trainer)
    trainer.fit()
    for b in seen:
        actor = [p == "actor" for p in b["policies"]]
        want, _ = compute_grpo_split_advantages(
            b["scores_B"], b["response_mask_BR"], b["uids"], actor
        )
        torch.testing.assert_close(b["advantages_BR"], want.to(b["advantages_BR"].dtype))
    assert kl_rows and all(r is not None for r in kl_rows)
    assert sum(float((1 - r).sum()) for r in kl_rows) > 0  # fixed rows are out of the KL
    assert sum(int(r.sum()) for r in nll_rows) > 0  # some fixed success was trained by NLL
    for rec in read_metrics(out):
        assert 0.0 <= rec["mixture/fixed_grad_share"] <= 1.0
        for key in (
            "actor/kl_loss",
            "mixture/shaping_grad_weight_mean",
            "mixture/rescued_group_frac",
            "mixture/is_weight_raw_mean",
            "mixture/is_ess",
            "mixture/guided_row_frac",
            "mixture/guided_loss",
        ):
            assert math.isfinite(rec[key]), key
        assert not any(k.startswith("mixture/_") for k in rec)  # the summed masses stay inside


def test_the_grad_share_counts_the_fixed_rows_and_only_them(mix_config, tmp_path):
    """Fixed rows with shaping and guided NLL hold part of the update's weight; when the schedule
    gives every group to the actor (α = 1, whole groups: no fixed row), the share is 0."""
    (rec,) = Trainer(mix_config(out=tmp_path / "g", **RECIPE)).fit()
    assert rec["mixture/fixed_grad_share"] > 0
    whole = {"rollout_allocation_schedule.groups": "whole", "rollout_allocation_schedule.alpha": 1}
    (none,) = Trainer(mix_config(out=tmp_path / "a", **whole)).fit()  # the actor samples all
    assert none["mixture/fixed_grad_share"] == 0.0


def test_an_actor_only_run_logs_no_mixture_share(make_train_config, tmp_path):
    (rec,) = Trainer(make_train_config(steps=1, out=tmp_path / "plain")).fit()
    assert "mixture/fixed_grad_share" not in rec


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"rollout_only.guided_coef": -1}, "guided_coef"),
        ({"rollout_only.guided_min_score": "nan"}, "guided_min_score"),
        ({"algorithm.adv_estimator": "grpo_spilt"}, "grpo_split"),
        (
            {"rollout_only.fixed_kl_loss": "false", "algorithm.use_kl_in_reward": "true"},
            "use_kl_in_reward",
        ),
    ],
)
def test_bad_fixed_row_settings_are_config_errors(mix_config, tmp_path, extra, match):
    with pytest.raises(ConfigError, match=match):
        Trainer(mix_config(out=tmp_path / "bad", **extra))


def test_the_new_keys_need_a_fixed_policy(make_train_config, tmp_path):
    with pytest.raises(ConfigError, match="model_path is empty"):
        Trainer(make_train_config(out=tmp_path / "x", **{"rollout_only.guided_coef": 1.0}))


def test_the_recipe_config_trains_its_environments_on_tiny_models(
    tiny_model_dir, tiny_fixed_dir, tmp_path
):
    """configs/mixture_teacher.yaml as shipped, with only the models, sizes and outputs made
    tiny: its options run together on its calculator, search and direct episodes."""
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig

    recipe = Path(__file__).resolve().parents[2] / "configs" / "mixture_teacher.yaml"
    out = tmp_path / "recipe"
    tiny = {
        "actor_rollout_ref.model.path": tiny_model_dir,
        "actor_rollout_ref.model.dtype": "float32",
        "rollout_only.model_path": tiny_fixed_dir,
        "actor_rollout_ref.rollout.name": "hf",
        "actor_rollout_ref.rollout.n": 2,
        "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn": 8,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "data.train_batch_size": 2,
        "data.max_response_length": 48,
        "data.max_prompt_length": 4096,
        "data.filter_overlong_prompts": "false",
        "trainer.total_training_steps": 1,
        "trainer.val_before_train": "false",
        "trainer.test_freq": -1,
        "trainer.save_freq": -1,
        "trainer.save_hf_model": "false",
        "trainer.logger": "[jsonl]",
        "trainer.output_dir": out,
        "trainer.rollout_data_dir": out / "dumps",
    }
    cfg = load_config(TrainConfig, str(recipe), [f"{k}={v}" for k, v in tiny.items()])
    (rec,) = Trainer(cfg).fit()
    assert rec["rollout/using_fixed"] == pytest.approx(1 / 3)  # 2 actor + 1 fixed a group
    assert rec["mixture/mixed_group_frac"] == 1.0
    assert 0.0 <= rec["mixture/fixed_grad_share"] <= 1.0
    assert math.isfinite(rec["actor/kl_loss"]) and math.isfinite(rec["actor/grad_norm"])
