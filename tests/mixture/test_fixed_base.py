"""A fixed policy taken from a training checkpoint: its adapter means nothing on another base of
the same shape and would load silently, so it is refused in one line naming both bases (as
resume, eval and infer refuse it); full weights and adapters outside a checkpoint load as before."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from tests.conftest import train_overrides
from toolgrpo.cli import main
from toolgrpo.config.schema import ModelConfig
from toolgrpo.mixture import policies
from toolgrpo.mixture.policies import FixedPolicies, fixed_specs
from toolgrpo.models.identity import BASE_KEY, BaseModelMismatch, base_identity
from toolgrpo.models.loading import load_policy, load_tokenizer

RO = "rollout_only."


@pytest.fixture(scope="module")
def lora_ckpt(tiny_model_dir, tmp_path_factory):
    """A LoRA checkpoint of the tiny model as the trainer writes one: ``adapter/`` and a
    ``trainer_state.json`` that records its base."""
    ckpt = tmp_path_factory.mktemp("fixed_base") / "checkpoints" / "global_step_1"
    policy = load_policy(ModelConfig(path=str(tiny_model_dir), lora_rank=4), trainable=True)
    policy.model.save_pretrained(ckpt / "adapter")
    state = {"global_step": 1, "is_lora": True}
    state[BASE_KEY] = base_identity(str(tiny_model_dir), policy.resolved.hf_dir)
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    return ckpt


@pytest.fixture
def fixed(make_train_config, tiny_model_dir):
    """``fixed(**rollout_only)`` -> the FixedPolicies a run with those settings builds."""

    def make(**ro):
        cfg = make_train_config(**{RO + k: str(v) for k, v in ro.items()})
        specs = fixed_specs(cfg)
        return specs, FixedPolicies(specs, load_tokenizer(tiny_model_dir), str(tiny_model_dir))

    return make


@pytest.fixture
def no_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a fixed model was loaded before its base was checked")

    monkeypatch.setattr(policies, "load_policy", refuse)


@pytest.mark.parametrize("where", ["adapter", "checkpoint"])
def test_a_checkpoints_adapter_on_another_base_is_refused(
    where, fixed, lora_ckpt, tiny_model_dir, tiny_fixed_dir, no_load
):
    """Pins: the adapter was applied to whatever ``rollout_only.model_path`` named."""
    adapter = lora_ckpt / "adapter" if where == "adapter" else lora_ckpt
    with pytest.raises(BaseModelMismatch) as e:
        fixed(model_path=tiny_fixed_dir, adapter_path=adapter)
    text = str(e.value)
    assert "\n" not in text and str(lora_ckpt) in text
    assert str(tiny_model_dir) in text and str(tiny_fixed_dir) in text
    assert f"{RO}model_path={tiny_fixed_dir}" in text


def test_an_extra_policys_adapter_is_checked_too(fixed, lora_ckpt, tiny_fixed_dir, no_load):
    extra = f'[{{"model_path": "{tiny_fixed_dir}", "adapter_path": "{lora_ckpt / "adapter"}"}}]'
    with pytest.raises(BaseModelMismatch, match=r"rollout_only\.extra_policies\[0\]\.model_path"):
        fixed(model_path=tiny_fixed_dir, extra_policies=extra)


def test_the_cli_refuses_it_in_one_line(
    lora_ckpt, tiny_model_dir, tiny_fixed_dir, tiny_data, tmp_path, capsys
):
    ov = train_overrides(tiny_model_dir, tiny_data, tmp_path / "run", 1)
    ov += [f"{RO}model_path={tiny_fixed_dir}", f"{RO}adapter_path={lora_ckpt / 'adapter'}"]
    assert main(["train", *ov]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [s for s in err.splitlines() if s.startswith("toolgrpo train: error:")]
    assert len(lines) == 1 and "trained on" in lines[0]
    assert str(tiny_model_dir) in lines[0] and str(tiny_fixed_dir) in lines[0]


def test_the_adapter_on_its_own_base_loads(fixed, lora_ckpt, tiny_model_dir):
    _, fp = fixed(model_path=tiny_model_dir, adapter_path=lora_ckpt / "adapter")
    assert fp.loaded == 1 and fp.policy("fixed").is_lora


def test_a_checkpoint_as_model_path_is_its_adapter_on_its_base(fixed, lora_ckpt):
    """Pins: a ``global_step_N`` directory was 'not an HF model'."""
    specs, fp = fixed(model_path=lora_ckpt)
    assert specs[0].model.path == str(lora_ckpt / "adapter")
    assert fp.policy("fixed").is_lora


def test_a_changed_base_of_a_bare_adapter_is_refused(fixed, lora_ckpt, tmp_path, no_load):
    ckpt = shutil.copytree(lora_ckpt, tmp_path / "global_step_1")
    state = json.loads((ckpt / "trainer_state.json").read_text())
    state[BASE_KEY]["hash"] = "0123456789abcdef"  # the base directory held other weights then
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(BaseModelMismatch, match="has changed since"):
        fixed(model_path=ckpt / "adapter")


def test_full_weights_load_whatever_base_they_started_from(
    fixed, tiny_fixed_dir, tiny_model_dir, tmp_path
):
    """A full-weights checkpoint records the base it started from; it needs no base to load."""
    ckpt = tmp_path / "global_step_3"
    shutil.copytree(tiny_fixed_dir, ckpt / "model")
    state = {"global_step": 3, BASE_KEY: base_identity("elsewhere", tiny_model_dir)}
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    for path in (ckpt, ckpt / "model"):
        specs, fp = fixed(model_path=path)
        assert specs[0].model.path == str(ckpt / "model") and not fp.policy("fixed").is_lora


def test_adapters_outside_a_checkpoint_record_nothing_and_load(
    fixed, lora_ckpt, tiny_fixed_dir, tmp_path
):
    """A user's own adapter (or an alias's shipped one) has no checkpoint record to compare."""
    adapter = shutil.copytree(lora_ckpt / "adapter", tmp_path / "my_adapter")
    _, fp = fixed(model_path=tiny_fixed_dir, adapter_path=adapter)
    assert fp.policy("fixed").is_lora


def test_a_checkpoint_without_the_record_loads_with_a_warning(
    fixed, lora_ckpt, tiny_fixed_dir, tmp_path, caplog
):
    ckpt = shutil.copytree(lora_ckpt, tmp_path / "global_step_1")
    state = json.loads((ckpt / "trainer_state.json").read_text())
    del state[BASE_KEY]
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    with caplog.at_level(logging.WARNING):
        fixed(model_path=tiny_fixed_dir, adapter_path=ckpt / "adapter")
    assert "does not record its base model" in caplog.text
