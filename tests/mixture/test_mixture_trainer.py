"""The mixture inside the trainer, on tiny models: who samples, old log-probs, metrics, resume,
multi-turn, GAE, offloading, and the startup errors."""

from __future__ import annotations

import math
import shutil
import zlib

import pytest
import torch

from tests.conftest import read_metrics
from toolgrpo.config.loader import ConfigError
from toolgrpo.rewards.scoring import Score
from toolgrpo.trainer import rollout_stage as trainer_mod
from toolgrpo.trainer.trainer import Trainer

IS_KEYS = ["actor/importance_sampling"] + [
    f"actor/importance_weight_{s}" for s in ("mean", "std", "min", "max", "ess")
]
ROLLOUT_KEYS = ["rollout/policy_choice", "rollout/using_actor", "rollout/using_fixed"]


def _varied_score(task, text, step, flags):
    v = float(zlib.crc32(text.encode()) % 7) - 3.0
    return Score(v, 0.0, v, 0.0, False, False)


@pytest.fixture(autouse=True)
def _scores(monkeypatch):
    monkeypatch.setattr(trainer_mod, "score", _varied_score)


@pytest.fixture
def mix_config(make_train_config, tiny_fixed_dir):
    def make(steps=4, out=None, **extra):
        base = {
            "rollout_only.model_path": str(tiny_fixed_dir),
            "rollout_only.temperature": 0.8,
            "rollout_allocation_schedule.type": "constant",
            "rollout_allocation_schedule.alpha": 0.5,
            "trainer.save_hf_model": "false",
        }
        return make_train_config(steps=steps, out=out, **{**base, **extra})

    return make


def _capture(trainer: Trainer) -> list:
    seen = []
    orig = trainer.actor.update

    def update(batch):
        seen.append(
            {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in vars(batch).items()}
        )
        return orig(batch)

    trainer.actor.update = update
    return seen


def _fixed(batch) -> torch.Tensor:
    return torch.tensor([p != "actor" for p in batch["policies"]])


def test_constant_half_mixture_logs_finite_importance_metrics(mix_config, tmp_path):
    out = tmp_path / "mix"
    trainer = Trainer(mix_config(out=out))
    assert trainer.mixture is not None and trainer.mixture.fixed.loaded == 1
    (fixed,) = trainer.mixture.fixed._models.values()
    assert not any(p.requires_grad for p in fixed.model.parameters())  # frozen, no optimizer
    seen = _capture(trainer)
    trainer.fit()
    recs = read_metrics(out)
    choices = [r["rollout/policy_choice"] for r in recs]
    assert set(choices) == {0.0, 1.0}, choices  # both policies sampled some step
    for rec, batch in zip(recs, seen, strict=True):
        for k in ROLLOUT_KEYS + ["actor/importance_sampling"]:
            assert math.isfinite(rec[k]), k
        fixed_step = rec["rollout/policy_choice"] == 0.0
        assert set(batch["policies"]) == ({"fixed"} if fixed_step else {"actor"})
        assert rec["rollout/using_fixed"] == float(fixed_step)
        if fixed_step:
            for k in IS_KEYS:
                assert k in rec and math.isfinite(rec[k]), k
            assert rec["actor/importance_sampling"] == 1.0
            assert 0 < rec["actor/importance_weight_ess"] <= 1
            # the default (decoupled): PPO clips around the actor's own log-probs, and a
            # truncated sequence weight min(π_old/π_fixed, 2) multiplies the loss
            assert not torch.equal(batch["old_logprobs_BR"], batch["rollout_logprobs_BR"])
            w = batch["is_weights_BR"]
            assert w is not None and float(w.max()) <= 2.0 and (w != 1).any()
            assert 0 < rec["rollout/fixed_seq_ess"] <= 1
            assert 0 <= rec["rollout/fixed_groups_with_signal"] <= 1
        assert math.isfinite(rec["actor/pg_loss"])


def test_fixed_rows_keep_sampler_logprobs_when_the_actor_recomputes(mix_config, tmp_path):
    """Bypass mode (the design's literal method): with two PPO epochs the trainer recomputes old
    log-probs with the actor, yet the fixed rows must still hold the fixed policy's
    (temperature 0.8) log-probs, not the actor's."""
    cfg = mix_config(
        steps=1,
        out=tmp_path / "r",
        **{
            "rollout_only.bypass_mode": "true",
            "actor_rollout_ref.actor.ppo_epochs": 2,
            "rollout_allocation_schedule.alpha": 0.5,
            "rollout_allocation_schedule.per_sample": "true",
            "data.train_batch_size": 4,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
        },
    )
    trainer = Trainer(cfg)
    seen = _capture(trainer)
    (rec,) = trainer.fit()
    b = seen[0]
    fixed = _fixed(b)
    assert 0 < int(fixed.sum()) < len(fixed), b["policies"]  # a mixed batch
    assert rec["actor/old_logprob_reused"] == 0.0
    mask = b["response_mask_BR"].bool()
    assert torch.equal(b["old_logprobs_BR"][fixed], b["rollout_logprobs_BR"][fixed])
    actor_rows = ~fixed
    diff = (b["old_logprobs_BR"] - b["rollout_logprobs_BR"]).abs()[actor_rows][mask[actor_rows]]
    assert diff.max() < 1e-4  # actor rows: recomputed, equal to generation (same weights)
    assert rec["rollout/logprob_diff_mean"] < 1e-4  # restated over the actor's rows only
    assert rec["actor/importance_weight_max"] > rec["actor/importance_weight_min"]


def test_per_sample_mixing_keeps_each_group_with_one_policy(mix_config, tmp_path):
    cfg = mix_config(
        steps=3,
        out=tmp_path / "ps",
        **{"rollout_allocation_schedule.per_sample": "true", "data.train_batch_size": 4},
    )
    trainer = Trainer(cfg)
    seen = _capture(trainer)
    trainer.fit()
    mixed = 0
    for b in seen:
        by_group: dict[str, set[str]] = {}
        for u, p in zip(b["uids"], b["policies"], strict=True):
            by_group.setdefault(u, set()).add(p)
        assert all(len(v) == 1 for v in by_group.values())
        mixed += len(set(b["policies"])) > 1
    assert mixed > 0


@pytest.mark.parametrize("mode", ["token", "sequence"])
def test_tis_weights_reach_the_loss_for_fixed_rows_only(mix_config, tmp_path, mode):
    cfg = mix_config(
        steps=1,
        out=tmp_path / mode,
        **{
            "rollout_only.rollout_is": mode,
            "rollout_only.rollout_is_threshold": 1.5,
            "rollout_allocation_schedule.per_sample": "true",
            "data.train_batch_size": 4,
        },
    )
    trainer = Trainer(cfg)
    seen = _capture(trainer)
    (rec,) = trainer.fit()
    b = seen[0]
    fixed, w = _fixed(b), b["is_weights_BR"]
    # the actor's rows carry only the rollout correction min(π_old/π_rollout, 2): the HF
    # sampler's fp32 log-probs equal the trainer's up to rounding
    torch.testing.assert_close(w[~fixed], torch.ones_like(w[~fixed]), rtol=0, atol=1e-4)
    assert w[fixed].max() <= 1.5 and (w[fixed] != 1).any()
    # decoupled: PPO clips around the actor, so old = the actor's log-probs on fixed rows too
    assert not torch.equal(b["old_logprobs_BR"][fixed], b["rollout_logprobs_BR"][fixed])
    assert math.isfinite(rec["actor/importance_weight_truncated_frac"])


def test_resume_reproduces_the_policy_choices(mix_config, tmp_path):
    straight = tmp_path / "straight"
    Trainer(mix_config(steps=5, out=straight, **{"trainer.save_freq": 1})).fit()
    resumed = tmp_path / "resumed"
    Trainer(mix_config(steps=2, out=resumed, **{"trainer.save_freq": 1})).fit()
    Trainer(mix_config(steps=5, out=resumed, **{"trainer.save_freq": 1})).fit()
    a, b = read_metrics(straight), read_metrics(resumed)
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5]
    key = "rollout/policy_choice"
    assert [r[key] for r in a] == [r[key] for r in b]
    assert [r["reward/mean"] for r in a] == [r["reward/mean"] for r in b]


def test_multi_turn_episodes_use_the_fixed_generator(mix_config, tmp_path):
    cfg = mix_config(
        steps=2,
        out=tmp_path / "mt",
        **{
            "actor_rollout_ref.rollout.multi_turn.enable": "true",
            "rollout_allocation_schedule.alpha": 0.0,
            "rollout_only.bypass_mode": "true",
        },
    )
    trainer = Trainer(cfg)
    seen = _capture(trainer)
    trainer.fit()
    for b in seen:
        assert set(b["policies"]) == {"fixed"} and len(b["policies"]) == len(b["uids"])
        assert torch.equal(b["old_logprobs_BR"], b["rollout_logprobs_BR"])
    for r in read_metrics(tmp_path / "mt"):
        assert r["rollout/using_fixed"] == 1.0 and math.isfinite(r["actor/importance_weight_mean"])


def test_gae_critic_learns_from_fixed_rows(mix_config, tmp_path):
    cfg = mix_config(
        steps=2,
        out=tmp_path / "gae",
        **{"algorithm.adv_estimator": "gae", "rollout_allocation_schedule.alpha": 0.0},
    )
    trainer = Trainer(cfg)
    seen = _capture(trainer)
    hist = trainer.fit()
    assert all(set(b["policies"]) == {"fixed"} for b in seen)
    assert all(math.isfinite(h["critic/vf_loss"]) for h in hist)
    assert any(h["critic/vf_loss"] > 0 for h in hist)
    assert seen[1]["old_values_BR"].abs().sum() > 0  # the value head was trained on them


def test_offload_frees_the_fixed_model_between_steps(mix_config, tmp_path):
    cfg = mix_config(steps=2, out=tmp_path / "off", **{"rollout_only.offload": "true"})
    trainer = Trainer(cfg)
    assert trainer.mixture.fixed.loaded == 0
    trainer.fit()
    assert trainer.mixture.fixed.loaded == 0


def test_extra_policy_at_another_temperature_shares_the_loaded_model(mix_config, tmp_path):
    cfg = mix_config(
        steps=2,
        out=tmp_path / "extra",
        **{
            "rollout_only.extra_policies": "[{temperature: 1.5, weight: 1.0}]",
            "rollout_allocation_schedule.alpha": 0.0,
            "rollout_allocation_schedule.per_sample": "true",
            "data.train_batch_size": 4,
        },
    )
    trainer = Trainer(cfg)
    assert trainer.mixture.fixed.loaded == 1
    assert trainer.mixture.fixed.specs["fixed_1"].params.temperature == 1.5
    assert trainer.mixture.fixed.specs["fixed"].params.temperature == 0.8
    seen = _capture(trainer)
    trainer.fit()
    assert {p for b in seen for p in b["policies"]} == {"fixed", "fixed_1"}
    assert "rollout/using/fixed_1" in read_metrics(tmp_path / "extra")[0]


def test_async_rollouts_with_a_mixture(mix_config, tmp_path):
    out = tmp_path / "async"
    extra = {"async_training.enable": "true", "async_training.staleness_threshold": "1"}
    Trainer(mix_config(steps=4, out=out, **extra)).fit()
    recs = read_metrics(out)
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    assert {r["rollout/policy_choice"] for r in recs} == {0.0, 1.0}


# ---- bad input -------------------------------------------------------------------------------
def test_missing_fixed_model_path_is_a_config_error(make_train_config, tmp_path):
    cfg = make_train_config(**{"rollout_only.model_path": str(tmp_path / "nowhere")})
    with pytest.raises(ConfigError, match=r"rollout_only\.model_path=.*nowhere"):
        Trainer(cfg)


def test_settings_without_a_fixed_model_path_are_refused(make_train_config):
    with pytest.raises(ConfigError, match=r"rollout_only\.model_path is empty"):
        Trainer(make_train_config(**{"rollout_allocation_schedule.type": "linear"}))


def test_tokenizer_mismatch_names_both_models(mix_config, tiny_fixed_dir, tmp_path):
    from transformers import AutoTokenizer

    other = tmp_path / "other_tok"
    shutil.copytree(tiny_fixed_dir, other)
    tok = AutoTokenizer.from_pretrained(str(other))
    tok.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})
    tok.save_pretrained(str(other))
    cfg = mix_config(**{"rollout_only.model_path": str(other)})
    with pytest.raises(ConfigError, match="tokenizer") as ei:
        Trainer(cfg)
    assert str(other) in str(ei.value) and cfg.actor_rollout_ref.model.path in str(ei.value)


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"rollout_allocation_schedule.type": "cosine"}, r"rollout_allocation_schedule\.type"),
        ({"rollout_allocation_schedule.alpha": 1.2}, r"rollout_allocation_schedule\.alpha"),
        (
            {
                "rollout_allocation_schedule.type": "exponential",
                "rollout_allocation_schedule.gamma": -1,
            },
            "gamma",
        ),
        (
            {
                "rollout_allocation_schedule.type": "step",
                "rollout_allocation_schedule.switch_steps": "[4,2]",
            },
            "strictly increasing",
        ),
        ({"rollout_only.rollout_is": "vtrace"}, r"rollout_only\.rollout_is="),
        ({"rollout_only.rollout_is_threshold": 0}, r"rollout_is_threshold"),
        ({"rollout_allocation_schedule.type": "lnear"}, r"did you mean 'linear'"),
        ({"rollout_only.top_p": 1.5}, r"rollout_only\.top_p"),
        ({"rollout_only.extra_policies": "[{temperature: 0}]"}, r"extra_policies\[0\]"),
        (
            {"algorithm.use_kl_in_reward": "true", "rollout_only.bypass_mode": "true"},
            "use_kl_in_reward",
        ),
    ],
)
def test_bad_mixture_settings_are_config_errors(mix_config, extra, match):
    with pytest.raises(ConfigError, match=match):
        Trainer(mix_config(**extra))


def test_feature_is_off_by_default(make_train_config, tmp_path):
    trainer = Trainer(make_train_config(steps=1, out=tmp_path / "plain"))
    assert trainer.mixture is None
    (rec,) = trainer.fit()
    assert not any(k.startswith(("rollout/using", "actor/importance")) for k in rec)
