"""A checkpoint used on a base model it was not trained on: its adapter would load silently
on any base of the same shape. Every checkpoint records its base; eval, infer and resume
refuse another in one line naming both; older checkpoints load with a warning."""

from __future__ import annotations

import json
import logging

import pytest

from tests.probes.conftest import one_error_line
from toolgrpo.cli import main
from toolgrpo.config.loader import load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.eval.cli import apply_checkpoint
from toolgrpo.models.identity import BaseModelMismatch, model_hash
from toolgrpo.trainer.trainer import Trainer

MODEL = "actor_rollout_ref.model.path"


def _ckpt(run):
    return run / "checkpoints" / "global_step_2"


def test_every_checkpoint_records_its_base(lora_run, tiny_model_dir):
    for step in (1, 2):
        state = json.loads(
            (lora_run / f"checkpoints/global_step_{step}/trainer_state.json").read_text()
        )
        assert state["base_model"]["hash"] == model_hash(tiny_model_dir)
        assert state["base_model"]["path"] == str(tiny_model_dir)


def test_the_hash_tells_same_shaped_bases_apart(tiny_model_dir, other_base):
    assert (other_base / "config.json").read_bytes() == (
        tiny_model_dir / "config.json"
    ).read_bytes()
    assert model_hash(other_base) != model_hash(tiny_model_dir)


@pytest.mark.parametrize("command", ["eval", "infer"])
def test_adapter_on_another_base_is_refused(command, lora_run, other_base, capsys, no_model):
    """Pins: ``eval``/``infer --checkpoint`` applied an adapter to whatever base was set."""
    args = [command, "--checkpoint", str(_ckpt(lora_run)), f"{MODEL}={other_base}"]
    args += ["what is 2+2?"] if command == "infer" else []
    assert main(args) == 2
    line = one_error_line(capsys.readouterr().err, command)
    assert str(_ckpt(lora_run)) in line and str(other_base) in line and "trained on" in line


def test_resume_on_another_base_is_refused(run_copy, lora_config, other_base, tmp_path):
    """Pins: resume checked the model's path, never what the path holds."""
    with pytest.raises(BaseModelMismatch, match="trained on base model .* not on"):
        Trainer(lora_config(run_copy, steps=3, **{MODEL: str(other_base)}))
    # the same path holding other weights than when the checkpoint was written
    state = _ckpt(run_copy) / "trainer_state.json"
    rec = json.loads(state.read_text())
    rec["base_model"]["dir"] = rec["base_model"]["path"] = str(other_base)
    rec["base_model"]["hash"] = "0123456789abcdef"
    state.write_text(json.dumps(rec))
    with pytest.raises(BaseModelMismatch, match="has changed since"):
        Trainer(lora_config(run_copy, steps=3, **{MODEL: str(other_base)}))


def test_checkpoint_without_the_record_loads_with_a_warning(run_copy, tiny_model_dir, caplog):
    state = _ckpt(run_copy) / "trainer_state.json"
    rec = json.loads(state.read_text())
    del rec["base_model"]
    state.write_text(json.dumps(rec))
    cfg = load_config(TrainConfig, None, [f"{MODEL}={tiny_model_dir}"])
    with caplog.at_level(logging.WARNING):
        apply_checkpoint(cfg, str(_ckpt(run_copy)))
    assert cfg.actor_rollout_ref.model.adapter_path == str(_ckpt(run_copy) / "adapter")
    assert "does not record its base model" in caplog.text
