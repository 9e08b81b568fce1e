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


def test_an_sft_adapter_names_its_base_wherever_it_is_loaded(
    tiny_model_dir, tiny_data, other_base, tmp_path
):
    """Pins: ``toolgrpo sft``'s final adapter recorded no base (it has no trainer_state.json),
    so a warm start from it on another base of the same shape loaded silently."""
    from toolgrpo.config.schema import ModelConfig
    from toolgrpo.models.identity import ADAPTER_BASE_FILE
    from toolgrpo.models.loading import load_policy
    from toolgrpo.sft.config import SFTConfig
    from toolgrpo.sft.trainer import SFTTrainer

    out = tmp_path / "sft"
    ov = [f"model.path={tiny_model_dir}", "model.dtype=float32", f"data.train_files=[{tiny_data}]"]
    ov += ["data.max_length=4096", "data.train_batch_size=2", "trainer.total_training_steps=1"]
    ov += ["trainer.logger=[jsonl]", f"trainer.output_dir={out}"]
    SFTTrainer(load_config(SFTConfig, None, ov)).fit()
    adapter = out / "adapter"
    assert json.loads((adapter / ADAPTER_BASE_FILE).read_text())["hash"] == model_hash(
        tiny_model_dir
    )
    mine = ModelConfig(path=str(tiny_model_dir), dtype="float32", adapter_path=str(adapter))
    assert load_policy(mine, trainable=False).is_lora
    other = ModelConfig(path=str(other_base), dtype="float32", adapter_path=str(adapter))
    with pytest.raises(BaseModelMismatch, match="trained on base model .* not on model.path="):
        load_policy(other, trainable=False)
