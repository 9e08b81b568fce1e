"""Issue 15 item 2: a crafted ``optimizer.pt`` or ``router.pt`` is refused with a one-line error
on resume, ``toolgrpo sft`` resume and ``toolgrpo infer``; its payload never runs."""

from __future__ import annotations

import pytest

from tests.trainer.ckpt_runs import copy_run, finished_run, grpo_config, plant
from toolgrpo.cli import main
from toolgrpo.models.safe_load import UnsafeCheckpoint
from toolgrpo.router.infer import load_router
from toolgrpo.trainer.trainer import Trainer


@pytest.fixture(scope="module")
def base_run(tiny_model_dir, tiny_data, tmp_path_factory):
    return finished_run(tiny_model_dir, tiny_data, tmp_path_factory.mktemp("base") / "run")


def test_crafted_optimizer_pt_is_refused_on_resume(base_run, tiny_model_dir, tiny_data, tmp_path):
    """Pins: resume unpickled optimizer.pt with weights_only=False (the payload ran). An intact
    older checkpoint is not a reason to go on: a planted file is refused, not skipped."""
    out = copy_run(base_run, tmp_path / "run")
    marker = tmp_path / "PWNED"
    plant(out / "checkpoints" / "global_step_2" / "optimizer.pt", marker, scheduler={})
    with pytest.raises(UnsafeCheckpoint, match="optimizer.pt refused"):
        Trainer(grpo_config(tiny_model_dir, tiny_data, out, steps=3))
    assert not marker.exists()


def test_cli_gives_one_line_error(base_run, tiny_model_dir, tiny_data, tmp_path, capsys):
    """Pins: the CLI printed a traceback (or ran the payload) instead of one line."""
    from tests.conftest import train_overrides

    out = copy_run(base_run, tmp_path / "run")
    marker = tmp_path / "PWNED"
    plant(out / "checkpoints" / "global_step_2" / "optimizer.pt", marker, scheduler={})
    rc = main(["train", *train_overrides(tiny_model_dir, tiny_data, out, 3)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err[-1].startswith("toolgrpo train: error: ") and "refused" in err[-1]
    assert not marker.exists()


def test_crafted_router_pt_is_refused_by_infer(base_run, tiny_model_dir, tmp_path, capsys):
    """Pins: ``toolgrpo infer --checkpoint`` unpickled router.pt with weights_only=False."""
    ckpt = copy_run(base_run / "checkpoints" / "global_step_2", tmp_path / "ckpt")
    marker = tmp_path / "PWNED"
    plant(ckpt / "router.pt", marker, meta={})
    cfg = grpo_config(tiny_model_dir, tiny_model_dir, tmp_path / "x")
    with pytest.raises(UnsafeCheckpoint, match="router.pt refused"):
        load_router(cfg, None, str(ckpt))
    assert not marker.exists()
    args = ["infer", "--checkpoint", str(ckpt), f"actor_rollout_ref.model.path={tiny_model_dir}"]
    assert main([*args, "data.max_response_length=4", "What is 2+2?"]) == 2
    assert "router.pt refused" in capsys.readouterr().err
    assert not marker.exists()


def test_sft_resume_refuses_a_crafted_optimizer_pt(tiny_model_dir, tiny_data, tmp_path):
    """Pins: ``toolgrpo sft`` resume shares the unsafe load."""
    from tests.sft.test_sft import _sft_config
    from toolgrpo.sft.trainer import SFTTrainer

    out = tmp_path / "sft"
    SFTTrainer(_sft_config(tiny_model_dir, tiny_data, out, 1, "trainer.save_freq=1")).fit()
    marker = tmp_path / "PWNED"
    plant(out / "checkpoints" / "global_step_1" / "optimizer.pt", marker, scheduler={})
    with pytest.raises(UnsafeCheckpoint, match="refused"):
        SFTTrainer(_sft_config(tiny_model_dir, tiny_data, out, 2, "trainer.save_freq=1"))
    assert not marker.exists()
