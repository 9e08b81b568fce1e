"""The design's config is the contract (issue #17, items 1, 2, 5, 8): its command line and YAML
blocks run as written, old spellings are aliases that warn, unset rollout_only sampling keys take
the actor's values, an adaptive schedule reads training metrics, and the support gap is logged."""

from __future__ import annotations

import logging
import math
import zlib

import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import read_metrics, train_overrides
from toolgrpo.cli import main
from toolgrpo.config.loader import ConfigError, load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.config.validate import validate_train_config
from toolgrpo.mixture import build_schedule, fixed_specs
from toolgrpo.rewards.scoring import Score
from toolgrpo.trainer import rollout_stage
from toolgrpo.trainer.trainer import Trainer


def _varied_score(task, text, step, flags):
    v = float(zlib.crc32(text.encode()) % 7) - 3.0
    return Score(v, 0.0, v, 0.0, False, False)


@pytest.fixture(autouse=True)
def _scores(monkeypatch):
    monkeypatch.setattr(rollout_stage, "score", _varied_score)


def _base_yaml(tiny_model_dir, tiny_data, out, path, steps=2, **extra) -> str:
    """The tiny run as a YAML file (what ``toolgrpo train <cfg>`` reads)."""
    over = train_overrides(tiny_model_dir, tiny_data, out, steps, **extra)
    path.write_text(OmegaConf.to_yaml(OmegaConf.from_dotlist(over)))
    return str(path)


def test_the_design_command_line_runs_as_written(
    tiny_model_dir, tiny_fixed_dir, tiny_data, tmp_path, caplog
):
    """Failed on main: ``rollout_allocation_schedule.type`` was an unknown key."""
    out = tmp_path / "run"
    cfg = _base_yaml(
        tiny_model_dir, tiny_data, out, tmp_path / "base.yaml", **{"trainer.save_hf_model": False}
    )
    design = [
        f"rollout_only.model_path={tiny_fixed_dir}",
        "rollout_only.temperature=0.8",
        "rollout_only.top_p=0.95",
        "rollout_only.top_k=40",
        "rollout_allocation_schedule.type=constant",
        "rollout_allocation_schedule.alpha=0.5",
    ]
    with caplog.at_level(logging.WARNING):
        assert main(["train", cfg, "rollout_allocation_schedule.seed=3", *design]) == 0
    recs = read_metrics(out)
    assert len(recs) == 2
    assert {r["rollout/policy_choice"] for r in recs} == {0.0, 1.0}
    (fixed,) = [r for r in recs if r["rollout/policy_choice"] == 0.0]
    # item 5: top-k/top-p sampler -> a startup warning and a measured support gap
    assert "no importance weight repairs it" in caplog.text
    assert 0.0 < fixed["actor/is_support_gap"] < 1.0
    assert 0 < fixed["rollout/fixed_seq_ess"] <= 1
    assert math.isfinite(fixed["actor/importance_weight_mean"])


DESIGN_YAML = """
rollout_only:
  model_path: "{fixed}"
  temperature: 0.8
  top_p: 0.95
  top_k: 40
rollout_allocation_schedule:
{schedule}
"""
LINEAR = """  type: "linear"
  alpha_0: 0.1
  beta: 0.01
  max_alpha: 1.0"""
STEP = """  type: "step"
  switch_steps: [100, 500, 1000]
  initial_policy: "fixed\""""


@pytest.mark.parametrize("block", [LINEAR, STEP], ids=["linear", "step"])
def test_the_design_yaml_blocks_load_verbatim(tiny_fixed_dir, tmp_path, block):
    path = tmp_path / "design.yaml"
    path.write_text(DESIGN_YAML.format(fixed=tiny_fixed_dir, schedule=block))
    cfg = load_config(TrainConfig, path)
    validate_train_config(cfg)
    s = build_schedule(cfg.rollout_allocation_schedule)
    if "linear" in block:
        assert s.actor_probability(10) == pytest.approx(0.2)
    else:
        assert [s.get_policy_choice(k) for k in (99, 100, 499, 500)] == [
            "fixed",
            "actor",
            "actor",
            "fixed",
        ]


def test_the_design_step_schedule_trains(make_train_config, tiny_fixed_dir, tmp_path):
    out = tmp_path / "step"
    cfg = make_train_config(
        steps=3,
        out=out,
        **{
            "rollout_only.model_path": str(tiny_fixed_dir),
            "rollout_allocation_schedule.type": "step",
            "rollout_allocation_schedule.switch_steps": "[3]",
            "rollout_allocation_schedule.initial_policy": "fixed",
            "trainer.save_hf_model": "false",
        },
    )
    Trainer(cfg).fit()
    assert [r["rollout/using_fixed"] for r in read_metrics(out)] == [1.0, 1.0, 0.0]


@pytest.mark.parametrize(
    "old, new_key, new_value",
    [
        ("rollout_only.schedule.alpha0=0.3", "rollout_allocation_schedule.alpha_0", 0.3),
        ("rollout_only.schedule.type=linear", "rollout_allocation_schedule.type", "linear"),
        ("rollout_only.is_threshold=5", "rollout_only.rollout_is_threshold", 5.0),
        ("rollout_only.is_correction=ppo_clip", "rollout_only.bypass_mode", True),
        ("rollout_only.is_correction=tis_token", "rollout_only.rollout_is", "token"),
    ],
)
def test_old_spellings_are_aliases_that_warn(old, new_key, new_value, caplog):
    with caplog.at_level(logging.WARNING):
        cfg = load_config(TrainConfig, None, [old])
    section, key = new_key.split(".")
    assert getattr(getattr(cfg, section), key) == new_value
    assert "old alias" in caplog.text and old.split("=")[0] in caplog.text


def test_old_schedule_section_in_yaml_is_renamed(tmp_path, caplog):
    path = tmp_path / "old.yaml"
    path.write_text("rollout_only:\n  schedule:\n    type: exponential\n    gamma: 0.2\n")
    with caplog.at_level(logging.WARNING):
        cfg = load_config(TrainConfig, path)
    assert cfg.rollout_allocation_schedule.type == "exponential"
    assert cfg.rollout_allocation_schedule.gamma == 0.2
    assert "rollout_allocation_schedule.gamma" in caplog.text


def test_unknown_old_correction_value_is_refused():
    with pytest.raises(ConfigError, match="is_correction"):
        load_config(TrainConfig, None, ["rollout_only.is_correction=vtrace"])


def test_near_miss_of_a_design_key_suggests_it():
    with pytest.raises(ConfigError, match="alpha_0"):
        load_config(TrainConfig, None, ["rollout_allocation_schedule.alpha00=0.1"])


# ---- item 8: inheritance ---------------------------------------------------------------------
ACTOR_SAMPLING = {
    "actor_rollout_ref.rollout.temperature": 0.7,
    "actor_rollout_ref.rollout.top_p": 0.9,
    "actor_rollout_ref.rollout.top_k": 20,
    "actor_rollout_ref.rollout.generation_batch_size": 3,
    "actor_rollout_ref.rollout.stop": "[</tool_call>]",
}


def test_unset_rollout_only_sampling_keys_take_the_actors_values(make_train_config, tiny_fixed_dir):
    cfg = make_train_config(**ACTOR_SAMPLING, **{"rollout_only.model_path": str(tiny_fixed_dir)})
    (spec,) = fixed_specs(cfg)
    p = spec.params
    assert (p.temperature, p.top_p, p.top_k) == (0.7, 0.9, 20)
    assert spec.batch_size == 3 and p.stop == ("</tool_call>",)
    assert p.n == cfg.actor_rollout_ref.rollout.n
    assert p.max_new_tokens == cfg.data.max_response_length


def test_set_rollout_only_keys_override_only_themselves(make_train_config, tiny_fixed_dir):
    cfg = make_train_config(
        **ACTOR_SAMPLING,
        **{"rollout_only.model_path": str(tiny_fixed_dir), "rollout_only.top_k": 40},
    )
    (spec,) = fixed_specs(cfg)
    assert (spec.params.temperature, spec.params.top_p, spec.params.top_k) == (0.7, 0.9, 40)


def test_the_fixed_generator_samples_with_the_inherited_settings(
    make_train_config, tiny_fixed_dir, tmp_path, monkeypatch
):
    """What reaches the fixed policy's generate() call, not only the resolved spec."""
    cfg = make_train_config(
        steps=1,
        out=tmp_path / "inh",
        **ACTOR_SAMPLING,
        **{
            "rollout_only.model_path": str(tiny_fixed_dir),
            "rollout_allocation_schedule.alpha": 0.0,
            "trainer.save_hf_model": "false",
        },
    )
    trainer = Trainer(cfg)
    seen = []
    gen_cls = type(trainer.mixture.fixed.generator("fixed"))
    orig = gen_cls.generate

    def spy(self, prompts, params):
        seen.append((self.model, params))
        return orig(self, prompts, params)

    monkeypatch.setattr(gen_cls, "generate", spy)
    trainer.fit()
    fixed_model = trainer.mixture.fixed.policy("fixed").model
    assert seen and all(m is fixed_model for m, _ in seen)
    assert {(p.temperature, p.top_p, p.top_k) for _, p in seen} == {(0.7, 0.9, 20)}


# ---- item 2: an adaptive schedule in the loop ------------------------------------------------
def test_adaptive_schedule_raises_alpha_as_the_fixed_ess_falls(mix_cfg, tmp_path):
    out = tmp_path / "adaptive"
    Trainer(mix_cfg(out, steps=3)).fit()
    recs = read_metrics(out)
    assert recs[0]["rollout/alpha"] == 0.0  # nothing observed yet: α = alpha
    ess = recs[0]["rollout/fixed_seq_ess"]
    assert 0 < ess < 1
    assert recs[1]["rollout/alpha"] == pytest.approx(1.0 - ess)  # ema=1: the last ESS


def test_adaptive_schedule_resumes_from_the_logged_metrics(mix_cfg, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    Trainer(mix_cfg(straight, steps=4)).fit()
    Trainer(mix_cfg(resumed, steps=2)).fit()
    Trainer(mix_cfg(resumed, steps=4)).fit()
    a, b = read_metrics(straight), read_metrics(resumed)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for key in ("rollout/alpha", "rollout/using_fixed"):
        assert [r[key] for r in a] == [r[key] for r in b], key


@pytest.fixture
def mix_cfg(make_train_config, tiny_fixed_dir):
    def make(out, steps):
        return make_train_config(
            steps=steps,
            out=out,
            **{
                "rollout_only.model_path": str(tiny_fixed_dir),
                "rollout_allocation_schedule.type": "adaptive",
                "rollout_allocation_schedule.alpha": 0.0,
                "rollout_allocation_schedule.max_alpha": 1.0,
                "rollout_allocation_schedule.ema": 1.0,
                "rollout_allocation_schedule.per_sample": "true",
                "data.train_batch_size": 4,
                "trainer.save_freq": 1,
                "trainer.save_hf_model": "false",
            },
        )

    return make


# ---- item 5: the support gap ----------------------------------------------------------------
def test_support_gap_matches_a_brute_force_count(tiny_model_dir, tiny_fixed_dir):
    from toolgrpo.config.schema import ModelConfig
    from toolgrpo.mixture.support import support_gap, support_mask
    from toolgrpo.models.loading import load_policy
    from toolgrpo.rollout.generator import SamplingParams

    actor = load_policy(ModelConfig(path=str(tiny_model_dir), dtype="float32"), trainable=False)
    fixed = load_policy(ModelConfig(path=str(tiny_fixed_dir), dtype="float32"), trainable=False)
    torch.manual_seed(0)
    ids = torch.randint(0, 400, (3, 9))
    attn = torch.ones_like(ids)
    attn[0, :2] = 0  # a left-padded prompt
    mask = torch.ones(3, 4)
    mask[1, 3] = 0  # a right-padded response
    params = SamplingParams(n=1, temperature=0.8, top_k=40, top_p=0.95)
    gap, count = support_gap(actor, 1.3, fixed, params, ids, attn, mask, rows=2, positions=3)
    with torch.no_grad():
        from toolgrpo.models.logprobs import position_ids_from_mask

        pos = position_ids_from_mask(attn)
        la = actor.model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, 4:8]
        lf = fixed.model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, 4:8]
    keep = support_mask(lf.reshape(12, -1), params).reshape(3, 4, -1)
    want = (torch.softmax(la / 1.3, -1) * ~keep).sum(-1)
    assert count == 11
    assert gap == pytest.approx(float((want * mask).sum()), rel=1e-5)
    assert 0 < gap / count < 1
    full = SamplingParams(n=1, temperature=0.8)
    assert support_gap(actor, 1.0, fixed, full, ids, attn, mask)[0] == 0.0


def test_a_user_schedule_named_in_config_drives_training(
    make_train_config, tiny_fixed_dir, tmp_path
):
    """One class and its name: ``type=module:Class`` (no α: rollout/alpha is not logged)."""
    out = tmp_path / "user"
    cfg = make_train_config(
        steps=3,
        out=out,
        **{
            "rollout_only.model_path": str(tiny_fixed_dir),
            "rollout_allocation_schedule.type": "tests.mixture.test_schedule:EveryThird",
            "trainer.save_hf_model": "false",
        },
    )
    Trainer(cfg).fit()
    recs = read_metrics(out)
    assert [r["rollout/using_fixed"] for r in recs] == [0.0, 0.0, 1.0]
    assert not any("rollout/alpha" in r for r in recs)
