"""A full disk while a checkpoint is written: the user reads "disk full" and where, the
partial checkpoint is removed, and the last whole one is kept for resume."""

from __future__ import annotations

import errno
import json

import pytest

from tests.conftest import train_overrides
from tests.probes.conftest import one_error_line
from toolgrpo.cli import main
from toolgrpo.trainer import state
from toolgrpo.trainer.checkpoint import DiskFull, list_checkpoints, write_checkpoint

TORCH_WRITER = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"
SAFETENSORS = "Error while serializing: I/O error: No space left on device (os error 28)"

# What a full disk looks like from each writer a checkpoint uses.
HOSTILE_WRITES = {
    "oserror": OSError(errno.ENOSPC, "No space left on device"),
    "quota": OSError(errno.EDQUOT, "Disk quota exceeded"),
    "torch_save_to_a_path": RuntimeError(TORCH_WRITER),
    "safetensors": Exception(SAFETENSORS),
}


@pytest.mark.parametrize("error", HOSTILE_WRITES.values(), ids=HOSTILE_WRITES.keys())
def test_full_disk_while_writing_keeps_the_last_checkpoint(error, tmp_path):
    out = tmp_path / "run"
    write_checkpoint(out, 1, {"global_step": 1}, lambda d: (d / "w").write_text("whole"))

    def fill_up(d):
        (d / "w").write_text("half")
        raise error

    with pytest.raises(DiskFull, match=r"disk full: checkpoint global_step_2 .*global_step_1"):
        write_checkpoint(out, 2, {"global_step": 2}, fill_up)
    assert [s for s, _ in list_checkpoints(out)] == [1]
    assert (out / "checkpoints" / "global_step_1" / "w").read_text() == "whole"
    assert not list((out / "checkpoints").glob(".tmp_*"))  # no partial checkpoint left


def test_full_disk_during_training_is_one_line(
    lora_run, tmp_path, tiny_model_dir, tiny_data, monkeypatch, capsys
):
    """Pins: ``RuntimeError: ... unexpected pos ...`` with a traceback, and a torn temp dir."""
    import shutil

    out = shutil.copytree(lora_run, tmp_path / "run")

    def full(obj, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(state, "save_torch", full)
    extra = {"trainer.save_freq": 1, "trainer.save_hf_model": "false"}
    args = train_overrides(tiny_model_dir, tiny_data, out, steps=3, **extra)
    assert main(["train", *args, "actor_rollout_ref.model.lora_rank=4"]) == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "disk full: checkpoint global_step_3" in line and str(out / "checkpoints") in line
    assert [s for s, _ in list_checkpoints(out)] == [1, 2]
    last = json.loads((out / "checkpoints/global_step_2/trainer_state.json").read_text())
    assert last["global_step"] == 2


def test_full_disk_anywhere_else_is_one_line(monkeypatch, capsys, tmp_path):
    """A full disk outside a checkpoint (metrics, config.yaml) is said as such too."""

    class Trainer:
        def __init__(self, cfg):
            pass

        def fit(self):
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "metrics.jsonl"))

        def close(self):
            pass

    monkeypatch.setattr("toolgrpo.trainer.trainer.Trainer", Trainer)
    assert main(["train", f"trainer.output_dir={tmp_path}"]) == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert f"disk full: No space left on device: {tmp_path / 'metrics.jsonl'}" in line
