"""Mixed groups and policy shaping inside the trainer, on tiny models: the fixed samples share
their task's actor group, GRPO ranks the mixed group, shaped rows reach the loss, and the
honest-weight metrics are logged."""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from tests.conftest import read_metrics
from toolgrpo.algos import compute_grpo_advantages
from toolgrpo.config.loader import ConfigError
from toolgrpo.mixture import objective as objective_mod
from toolgrpo.rewards.scoring import Score
from toolgrpo.trainer import rollout_stage as trainer_mod
from toolgrpo.trainer.trainer import Trainer

RAW_KEYS = [
    "mixture/is_weight_raw_mean",
    "mixture/is_weight_raw_max",
    "mixture/is_ess",
    "mixture/is_truncated_frac",
]
MIXED = {
    "rollout_allocation_schedule.groups": "mixed",
    "rollout_allocation_schedule.alpha": 0.0,  # every group gets fixed samples
    "rollout_allocation_schedule.fixed_per_group": 1,
}


def _varied_score(task, text, step, flags):
    v = float(zlib.crc32(text.encode()) % 7) - 3.0
    return Score(v, 0.0, v, 0.0, False, False)


@pytest.fixture(autouse=True)
def _scores(monkeypatch):
    monkeypatch.setattr(trainer_mod, "score", _varied_score)


@pytest.fixture
def mix_config(make_train_config, tiny_fixed_dir):
    def make(steps=1, out=None, **extra):
        base = {
            "rollout_only.model_path": str(tiny_fixed_dir),
            "rollout_only.temperature": 0.8,
            "trainer.save_hf_model": "false",
            **MIXED,
        }
        return make_train_config(steps=steps, out=out, **{**base, **extra})

    return make


def _capture(trainer: Trainer) -> list[dict]:
    seen = []
    orig = trainer.actor.update

    def update(batch):
        seen.append(
            {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in vars(batch).items()}
        )
        return orig(batch)

    trainer.actor.update = update
    return seen


def _groups(b: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for u, p in zip(b["uids"], b["policies"], strict=True):
        out.setdefault(u, []).append(p)
    return out


def test_each_actor_group_holds_k_fixed_samples_ranked_together(mix_config, tmp_path):
    out = tmp_path / "mixed"
    cfg = mix_config(steps=2, out=out, **{"rollout_allocation_schedule.fixed_per_group": 2})
    trainer = Trainer(cfg)
    seen = _capture(trainer)
    trainer.fit()
    for b in seen:
        groups = _groups(b)
        assert len(groups) == 2  # data.train_batch_size tasks, one group each
        for members in groups.values():
            assert sorted(members) == ["actor", "actor", "fixed", "fixed"]  # n = 2, k = 2
        adv, _ = compute_grpo_advantages(b["scores_B"], b["response_mask_BR"], b["uids"])
        torch.testing.assert_close(b["advantages_BR"], adv.to(b["advantages_BR"].dtype))
        fixed = torch.tensor([p != "actor" for p in b["policies"]])
        assert b["shaping_BR"] is None  # the IS objective: weights, no shaping
        assert (b["is_weights_BR"][fixed] <= 2.0).all()
    for rec in read_metrics(out):
        assert rec["mixture/mixed_group_frac"] == 1.0
        assert 0.0 <= rec["mixture/rescued_group_frac"] <= 1.0
        assert rec["rollout/using_fixed"] == pytest.approx(0.5)
        for k in RAW_KEYS:
            assert math.isfinite(rec[k]), k
        assert rec["mixture/is_weight_raw_max"] >= rec["mixture/is_weight_raw_mean"]


def test_shaped_fixed_rows_reach_the_loss_through_policy_shaping(mix_config, tmp_path, monkeypatch):
    calls = []
    orig = objective_mod.shaped_policy_loss

    def spy(lp, adv, mask, gamma, fixed_lp, agg, scale, shaped, normalize):
        calls.append((gamma, fixed_lp is not None, shaped.clone(), normalize))
        return orig(lp, adv, mask, gamma, fixed_lp, agg, scale, shaped, normalize)

    monkeypatch.setattr(objective_mod, "shaped_policy_loss", spy)
    extra = {"rollout_only.fixed_loss": "shaped", "rollout_only.shaping_gamma": 0.2}
    trainer = Trainer(mix_config(out=tmp_path / "sh", **extra))
    seen = _capture(trainer)
    (rec,) = trainer.fit()
    b = seen[0]
    fixed = torch.tensor([p != "actor" for p in b["policies"]])
    mask = b["response_mask_BR"]
    torch.testing.assert_close(b["shaping_BR"][fixed], (mask[fixed] != 0).float())
    assert (b["shaping_BR"][~fixed] == 0).all()
    assert (b["is_weights_BR"][fixed] == 0).all()  # the PPO term is off on shaped rows
    assert calls and all(g == 0.2 and fixed and not n for g, fixed, _, n in calls)
    # each micro-batch twice: its loss, and the loss again for mixture/fixed_grad_share
    assert sum(float(c[2].sum()) for c in calls) == 2 * float(mask[fixed].sum())
    assert math.isfinite(rec["actor/pg_loss"]) and math.isfinite(rec["actor/grad_norm"])
    assert 0 < rec["mixture/shaping_grad_weight_mean"] <= 0.25
    for k in RAW_KEYS:
        assert math.isfinite(rec[k]), k
    # shaping_normalize: the same step, every shaped weight × (1 + γ)²/γ
    calls.clear()
    extra["rollout_only.shaping_normalize"] = "true"
    (norm,) = Trainer(mix_config(out=tmp_path / "shn", **extra)).fit()
    assert calls and all(n for *_, n in calls)
    gain = 1.2**2 / 0.2
    assert norm["mixture/shaping_grad_weight_mean"] == pytest.approx(
        gain * rec["mixture/shaping_grad_weight_mean"], rel=1e-4
    )


def test_multi_turn_episodes_join_their_actor_group(mix_config, tmp_path):
    cfg = mix_config(
        out=tmp_path / "mt",
        **{
            "actor_rollout_ref.rollout.multi_turn.enable": "true",
            "rollout_only.fixed_loss": "shaped",
        },
    )
    trainer = Trainer(cfg)
    seen = _capture(trainer)
    trainer.fit()
    for members in _groups(seen[0]).values():
        assert sorted(members) == ["actor", "actor", "fixed"]


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"rollout_only.fixed_loss": "shaped", "rollout_only.bypass_mode": "true"}, "bypass"),
        ({"rollout_allocation_schedule.groups": "mix"}, "mixed"),
        ({"rollout_only.fixed_loss": "luffy"}, "shaped"),
        ({"rollout_only.shaping_gamma": 0}, "shaping_gamma"),
        ({"rollout_allocation_schedule.fixed_per_group": 0}, "fixed_per_group"),
        ({"router.enable": "true"}, "router"),
    ],
)
def test_bad_mixed_or_shaped_settings_are_config_errors(mix_config, tmp_path, extra, match):
    with pytest.raises(ConfigError, match=match):
        Trainer(mix_config(out=tmp_path / "bad", **extra))
