"""End-to-end GRPO/PPO steps on the tiny model: metrics, checkpoints, estimators, KL, LoRA, NaNs."""

from __future__ import annotations

import json
import math
import zlib

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.conftest import read_metrics
from toolgrpo.config.schema import ModelConfig
from toolgrpo.models.loading import load_policy
from toolgrpo.models.logprobs import response_logprobs
from toolgrpo.rewards.scoring import Score
from toolgrpo.trainer import rollout_stage as trainer_mod
from toolgrpo.trainer.episodes import NonFiniteReward
from toolgrpo.trainer.trainer import Trainer

REQUIRED = (
    "step",
    "reward/mean",
    "reward/format/mean",
    "reward/correctness/mean",
    "actor/pg_loss",
    "actor/kl",
    "actor/entropy",
    "actor/clipfrac",
    "response_length/mean",
    "timing/gen_s",
    "timing/train_s",
    "timing/step_s",
    "tokens/generated",
    "perf/rss_gb",
    "perf/peak_rss_gb",
)


def _varied_score(task, text, step, flags):
    """A deterministic score that differs between samples, so advantages are non-zero."""
    v = float(zlib.crc32(text.encode()) % 7) - 3.0
    return Score(v, 0.0, v, 0.0, False, False)


def _all_finite(record: dict) -> None:
    for k, v in record.items():
        if isinstance(v, bool) or isinstance(v, str):
            continue
        assert v is not None, f"{k} is null (was NaN/inf)"
        assert math.isfinite(v), f"{k}={v}"


class _Capture:
    """Wraps Actor.update to keep a copy of each batch it trains on."""

    def __init__(self, trainer: Trainer):
        self.batches = []
        orig = trainer.actor.update

        def update(batch):
            self.batches.append(
                {
                    k: (v.detach().clone() if isinstance(v, torch.Tensor) else v)
                    for k, v in vars(batch).items()
                }
            )
            return orig(batch)

        trainer.actor.update = update


def test_two_step_grpo_run(make_train_config, tmp_path):
    out = tmp_path / "run"
    cfg = make_train_config(steps=2, out=out)
    trainer = Trainer(cfg)
    history = trainer.fit()
    assert len(history) == 2

    records = read_metrics(out)
    assert [r["step"] for r in records] == [1, 2]
    for rec in records:
        missing = [k for k in REQUIRED if k not in rec]
        assert not missing, missing
        _all_finite(rec)
        assert rec["tokens/generated"] > 0
        assert 0 < rec["response_length/mean"] <= 8
        assert rec["batch/size"] == 4  # 2 prompts x n=2
        assert rec["actor/kl"] == 0.0  # no reference policy: KL off
    assert (out / "config.yaml").is_file()

    ckpt = out / "checkpoints" / "global_step_2"
    assert ckpt.is_dir()
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and state["is_lora"] is False
    assert (ckpt / "optimizer.pt").is_file()
    model = AutoModelForCausalLM.from_pretrained(str(ckpt / "model"), dtype=torch.float32)
    live = trainer.policy.model.state_dict()
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, live[k], rtol=0, atol=0, msg=k)


def test_old_logprobs_recomputed_off_policy_match_rollout(make_train_config, tmp_path):
    """With two mini-batches the trainer recomputes old log-probs: they must equal what the
    generator recorded (same weights, fp32)."""
    cfg = make_train_config(
        steps=1,
        out=tmp_path / "r",
        **{
            "data.train_batch_size": 4,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
        },
    )
    (rec,) = Trainer(cfg).fit()
    assert rec["actor/old_logprob_reused"] == 0.0
    assert rec["rollout/logprob_diff_mean"] < 1e-4


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batching_does_not_change_the_gradient(
    make_train_config, tmp_path, monkeypatch, loss_agg_mode
):
    """Micro-batch losses are weighted so their sum is the mini-batch loss: the gradient the
    optimizer sees must not depend on ppo_micro_batch_size_per_gpu."""
    monkeypatch.setattr(trainer_mod, "score", _varied_score)
    grads, losses = [], []
    for micro in (1, 4):
        cfg = make_train_config(
            steps=1,
            out=tmp_path / f"m{micro}",
            **{
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": micro,
                "actor_rollout_ref.actor.loss_agg_mode": loss_agg_mode,
                "actor_rollout_ref.actor.grad_clip": 1e9,
                "trainer.save_freq": -1,
                "trainer.save_hf_model": "false",
            },
        )
        t = Trainer(cfg)
        seen = []
        named = list(t.policy.model.named_parameters())

        def before_step(opt, args, kwargs, _seen=seen, _named=named):
            _seen.append({n: p.grad.clone() for n, p in _named if p.grad is not None})

        t.actor.optimizer.register_step_pre_hook(before_step)
        (rec,) = t.fit()
        assert len(seen) == 1
        assert rec["actor/grad_norm"] > 0
        grads.append(seen[0])
        losses.append(rec["actor/pg_loss"])
    assert grads[0].keys() == grads[1].keys()
    for k in grads[0]:
        torch.testing.assert_close(grads[0][k], grads[1][k], rtol=1e-4, atol=1e-6, msg=k)
    assert losses[0] == pytest.approx(losses[1], rel=1e-4, abs=1e-6)


def test_gae_runs_with_value_head(make_train_config, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_mod, "score", _varied_score)
    out = tmp_path / "gae"
    cfg = make_train_config(steps=2, out=out, **{"algorithm.adv_estimator": "gae"})
    trainer = Trainer(cfg)
    assert trainer.actor.value_head is not None
    history = trainer.fit()
    for rec in read_metrics(out):
        _all_finite(rec)
        assert "critic/vf_loss" in rec
        assert rec["actor/old_logprob_reused"] == 0.0  # values need a pass anyway
    assert any(h["critic/vf_loss"] > 0 for h in history)
    head = trainer.actor.value_head
    assert head.weight.abs().sum() + head.bias.abs().sum() > 0  # it learned something
    opt = torch.load(out / "checkpoints" / "global_step_2" / "optimizer.pt", weights_only=False)
    assert opt["value_head"] is not None


def test_kl_loss_logs_nonzero_kl_after_an_update(make_train_config, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_mod, "score", _varied_score)
    out = tmp_path / "kl"
    cfg = make_train_config(
        steps=2,
        out=out,
        **{
            "actor_rollout_ref.actor.use_kl_loss": "true",
            "actor_rollout_ref.actor.kl_loss_coef": 0.1,
            "actor_rollout_ref.actor.optim.lr": 1e-3,
        },
    )
    trainer = Trainer(cfg)
    assert trainer.actor.ref is not None  # full fine-tuning: a separate frozen copy
    first, second = trainer.fit()
    assert first["actor/kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference at step 1
    assert "actor/kl_loss" in first and "actor/kl_loss" in second
    assert abs(second["actor/kl"]) > 1e-6
    for rec in read_metrics(out):
        _all_finite(rec)


def test_lora_grpo_uses_adapter_disabled_model_as_reference(
    make_train_config, tmp_path, tiny_model_dir, monkeypatch
):
    monkeypatch.setattr(trainer_mod, "score", _varied_score)
    out = tmp_path / "lora"
    cfg = make_train_config(
        steps=2,
        out=out,
        **{
            "actor_rollout_ref.model.lora_rank": 4,
            "actor_rollout_ref.actor.use_kl_loss": "true",
            "actor_rollout_ref.actor.optim.lr": 1e-2,
        },
    )
    trainer = Trainer(cfg)
    assert trainer.policy.is_lora
    assert trainer.actor.needs_ref and trainer.actor.ref is None  # no second model in memory
    cap = _Capture(trainer)
    first, second = trainer.fit()
    assert first["actor/kl"] == pytest.approx(0.0, abs=1e-6)  # LoRA B starts at 0
    assert abs(second["actor/kl"]) > 1e-6

    # The reference log-probs of step 2 are those of the untouched base model.
    b = cap.batches[1]
    base = load_policy(ModelConfig(path=str(tiny_model_dir), dtype="float32"), trainable=False)
    with torch.no_grad():
        ref = response_logprobs(
            base.model, b["input_ids_BT"], b["attention_mask_BT"], b["response_mask_BR"].shape[1]
        ).logprobs_BR
    m = b["response_mask_BR"].bool()
    torch.testing.assert_close(b["ref_logprobs_BR"][m], ref[m], rtol=0, atol=1e-4)
    # the actor has moved: its samples' log-probs (π_old comes from the update's own pass, so
    # the batch holds the sampler's, equal to the trainer's in fp32) are not the reference's
    assert b["old_source"] == "update"
    assert (b["rollout_logprobs_BR"][m] - ref[m]).abs().max() > 1e-5
    # and the adapter is enabled again after the reference pass
    assert trainer.policy.model.active_adapters == ["default"]

    ckpt = out / "checkpoints" / "global_step_2"
    assert (ckpt / "adapter" / "adapter_config.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(str(ckpt / "model"), dtype=torch.float32)
    ids = b["input_ids_BT"][:1]
    trainer.policy.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(
            merged(input_ids=ids).logits,
            trainer.policy.model(input_ids=ids).logits,
            rtol=1e-4,
            atol=1e-4,
        )


@pytest.mark.parametrize(
    "extra",
    [
        {"algorithm.adv_estimator": "dr_grpo"},
        {"algorithm.adv_estimator": "rloo"},
        {"actor_rollout_ref.actor.ppo_epochs": 2},
        {"actor_rollout_ref.rollout.top_k": 5, "actor_rollout_ref.rollout.temperature": 0.7},
        {"algorithm.use_kl_in_reward": "true", "algorithm.kl_ctrl.type": "adaptive"},
        {
            "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum-norm",
            "actor_rollout_ref.actor.entropy_coeff": 0.01,
            "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
        },
        {
            "actor_rollout_ref.actor.optim.lr_warmup_steps": 1,
            "actor_rollout_ref.actor.optim.warmup_style": "cosine",
        },
        {"actor_rollout_ref.actor.use_torch_compile": "true"},
    ],
    ids=[
        "dr_grpo",
        "rloo",
        "ppo_epochs2",
        "top_k",
        "kl_in_reward",
        "agg_norm",
        "cosine",
        "compiled",
    ],
)
def test_variants_run_and_log_finite_metrics(make_train_config, tmp_path, monkeypatch, extra):
    monkeypatch.setattr(trainer_mod, "score", _varied_score)
    out = tmp_path / "v"
    history = Trainer(make_train_config(steps=2, out=out, **extra)).fit()
    assert len(history) == 2
    for rec in read_metrics(out):
        assert all(k in rec for k in REQUIRED)
        _all_finite(rec)
    if "actor_rollout_ref.rollout.top_k" in extra or "actor_rollout_ref.actor.ppo_epochs" in extra:
        # truncated sampling / several epochs: old log-probs are recomputed, not reused
        assert history[0]["actor/old_logprob_reused"] == 0.0
    if "algorithm.use_kl_in_reward" in extra:
        assert "actor/reward_kl_penalty_coeff" in history[0]


def test_validation_during_training(make_train_config, tmp_path):
    out = tmp_path / "val"
    cfg = make_train_config(
        steps=2,
        out=out,
        **{
            "trainer.test_freq": 2,
            "trainer.val_before_train": "true",
            "data.val_batch_size": 3,
            "data.val_max_samples": 5,
        },
    )
    Trainer(cfg).fit()
    recs = read_metrics(out)
    assert [r["step"] for r in recs] == [0, 1, 2]
    for r in (recs[0], recs[2]):
        for k in ("val/reward/mean", "val/format_rate", "val/exact_call_rate"):
            assert k in r and math.isfinite(r[k])
        assert r["val/num_tasks"] == 5  # the first five of the eight val rows
    assert "val/reward/mean" not in recs[1]


def test_equal_scores_give_zero_advantages(make_train_config, tmp_path, monkeypatch):
    monkeypatch.setattr(
        trainer_mod, "score", lambda task, text, step, flags: Score(1.5, 1.0, 0.5, 0.0, True, True)
    )
    out = tmp_path / "flat"
    trainer = Trainer(make_train_config(steps=2, out=out))
    cap = _Capture(trainer)
    trainer.fit()
    for b in cap.batches:
        assert torch.equal(b["advantages_BR"], torch.zeros_like(b["advantages_BR"]))
        assert torch.equal(b["scores_B"], torch.full_like(b["scores_B"], 1.5))
    for rec in read_metrics(out):
        _all_finite(rec)
        assert rec["reward/mean"] == 1.5
        assert rec["reward/groups_all_equal_frac"] == 1.0
        assert rec["actor/pg_loss"] == 0.0
        assert rec["critic/advantages/mean"] == 0.0


def _nan_score(task, text, step, flags):
    return Score(float("nan"), float("nan"), 0.0, 0.0, False, None)


def test_nan_reward_error_policy_names_the_task(make_train_config, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_mod, "score", _nan_score)
    trainer = Trainer(make_train_config(steps=1, out=tmp_path / "nan"))
    ids = {t.task_id for t in trainer.tasks}
    with pytest.raises(NonFiniteReward) as ei:
        trainer.fit()
    assert any(tid in str(ei.value) for tid in ids)
    assert not (tmp_path / "nan" / "checkpoints").exists()


def test_nan_reward_zero_policy_continues(make_train_config, tmp_path, monkeypatch):
    calls = {"n": 0}

    def half_nan(task, text, step, flags):
        calls["n"] += 1
        if calls["n"] % 2:
            return _nan_score(task, text, step, flags)
        return Score(1.0, 1.0, 0.0, 0.0, True, None)

    monkeypatch.setattr(trainer_mod, "score", half_nan)
    out = tmp_path / "nanzero"
    history = Trainer(make_train_config(steps=2, out=out, **{"reward.nan_policy": "zero"})).fit()
    assert len(history) == 2
    for rec in read_metrics(out):
        assert rec["reward/nonfinite"] == 2.0  # 2 of the 4 samples per step
        assert rec["reward/mean"] == pytest.approx(0.5)
        _all_finite(rec)


def test_warm_start_adapter_is_the_kl_reference(make_train_config, tmp_path, tiny_model_dir):
    from toolgrpo.models.loading import trainable_parameters

    torch.manual_seed(0)
    warm = load_policy(ModelConfig(path=str(tiny_model_dir), dtype="float32", lora_rank=4))
    ids = warm.tokenizer("call the tool f with a = 1", return_tensors="pt").input_ids
    opt = torch.optim.AdamW(trainable_parameters(warm.model), lr=5e-2)
    for _ in range(3):
        warm.model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    adapter = tmp_path / "warm_adapter"
    warm.model.save_pretrained(adapter)

    cfg = make_train_config(
        steps=1,
        out=tmp_path / "ws",
        **{
            "actor_rollout_ref.model.adapter_path": str(adapter),
            "actor_rollout_ref.actor.use_kl_loss": "true",
        },
    )
    (rec,) = Trainer(cfg).fit()
    # Before any update the policy *is* its initial self: KL to the reference must be 0.
    assert rec["actor/kl"] == pytest.approx(0.0, abs=1e-6)
