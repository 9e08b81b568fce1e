"""Helpers for the checkpoint-safety and resume tests: one finished tiny run per module, copied
per test, and a pickle that would create a marker file if it were ever unpickled unsafely."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from tests.conftest import train_overrides
from toolgrpo.config.loader import load_config
from toolgrpo.config.schema import TrainConfig


def grpo_config(model_dir, data, out, steps: int = 2, **extra) -> TrainConfig:
    return load_config(TrainConfig, None, train_overrides(model_dir, data, out, steps, **extra))


def finished_run(model_dir, data, out: Path, steps: int = 2, **extra) -> Path:
    """A run of ``steps`` steps with a checkpoint at every step (``max_checkpoints`` 2)."""
    from toolgrpo.trainer.trainer import Trainer

    Trainer(grpo_config(model_dir, data, out, steps, **{"trainer.save_freq": 1, **extra})).fit()
    return out


def copy_run(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


class Payload:
    """Unpickling this calls ``open(marker, "w")``: the file appears iff code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def plant(path: Path, marker: Path, **plain) -> None:
    """Replace ``path`` with a pickle holding the payload beside plain entries."""
    torch.save({"optimizer": Payload(marker), **plain}, path)
