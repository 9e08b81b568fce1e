"""Runs the probes attack: one finished LoRA run whose checkpoints hold only the adapter (so its
base model matters), and a second tiny base of the same shape with other weights."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.trainer.ckpt_runs import finished_run, grpo_config

LORA = {
    "actor_rollout_ref.model.lora_rank": 4,
    "trainer.save_hf_model": "false",
    "trainer.save_freq": 1,
}


@pytest.fixture(scope="session")
def lora_run(tiny_model_dir, tiny_data, tmp_path_factory) -> Path:
    """Two steps, an adapter-only checkpoint at each (``global_step_1``, ``global_step_2``)."""
    return finished_run(tiny_model_dir, tiny_data, tmp_path_factory.mktemp("probe") / "run", **LORA)


@pytest.fixture
def run_copy(lora_run, tmp_path) -> Path:
    return Path(shutil.copytree(lora_run, tmp_path / "run"))


@pytest.fixture
def lora_config(tiny_model_dir, tiny_data):
    """``lora_config(out, steps=2, **overrides)``: the run's config, pointed at ``out``."""

    def make(out, steps: int = 2, **extra):
        return grpo_config(tiny_model_dir, tiny_data, out, steps, **{**LORA, **extra})

    return make


@pytest.fixture(scope="session")
def other_base(tmp_path_factory) -> Path:
    """The tiny model's architecture and size with other weights (as base vs instruct)."""
    from toolgrpo.models.tiny import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("other") / "model", seed=1)


def one_error_line(err: str, command: str) -> str:
    """The single ``toolgrpo COMMAND: error: ...`` line of stderr (warnings may surround it)."""
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith(f"toolgrpo {command}: error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: a refusal under test must come before it."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was refused")

    monkeypatch.setattr("toolgrpo.trainer.trainer.start_policy", refuse)
    for where in ("toolgrpo.eval.cli", "toolgrpo.infer"):
        monkeypatch.setattr(f"{where}.load_policy", refuse)
