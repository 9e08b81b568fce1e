"""Issue 15 item 4: an output directory holding another run is never written over; with
``trainer.overwrite_output_dir=true`` it is moved aside whole; every resume is announced."""

from __future__ import annotations

import pytest

from tests.conftest import read_metrics
from tests.trainer.ckpt_runs import copy_run, finished_run, grpo_config
from toolgrpo.config.loader import ConfigError
from toolgrpo.trainer.checkpoint import list_checkpoints
from toolgrpo.trainer.trainer import Trainer


@pytest.fixture(scope="module")
def base_run(tiny_model_dir, tiny_data, tmp_path_factory):
    return finished_run(tiny_model_dir, tiny_data, tmp_path_factory.mktemp("base") / "run")


def _snapshot(out):
    return {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_resume_disable_in_a_used_dir_is_refused(base_run, tiny_model_dir, tiny_data, tmp_path):
    """Pins: resume=disable truncated metrics.jsonl, and its checkpoint pruned the old run's."""
    out = copy_run(base_run, tmp_path / "run")
    before = _snapshot(out)
    cfg = grpo_config(tiny_model_dir, tiny_data, out, **{"trainer.resume": "disable"})
    with pytest.raises(ConfigError, match="holds another run .*overwrite_output_dir=true"):
        Trainer(cfg)
    assert _snapshot(out) == before


def test_overwrite_moves_the_old_run_aside(base_run, tiny_model_dir, tiny_data, tmp_path, capsys):
    """Pins: there was no way to start over without destroying the earlier run."""
    out = copy_run(base_run, tmp_path / "run")
    before = _snapshot(out)
    extra = {"trainer.resume": "disable", "trainer.overwrite_output_dir": "true"}
    trainer = Trainer(grpo_config(tiny_model_dir, tiny_data, out, steps=1, **extra))
    assert trainer.step == 0
    trainer.fit()
    (old,) = tmp_path.glob("run.old-*")
    assert _snapshot(old) == before  # the earlier run, whole
    assert "moved the earlier run" in capsys.readouterr().err
    assert [r["step"] for r in read_metrics(out)] == [1]
    assert [s for s, _ in list_checkpoints(out)] == [1]
    # and the default next run resumes this run, not the old one
    assert Trainer(grpo_config(tiny_model_dir, tiny_data, out, steps=1)).step == 1


def test_resume_is_announced(base_run, tiny_model_dir, tiny_data, tmp_path, capsys):
    """Pins: resume was logged at INFO, which the CLI does not show without -v."""
    out = copy_run(base_run, tmp_path / "run")
    trainer = Trainer(grpo_config(tiny_model_dir, tiny_data, out, steps=3))
    assert trainer.step == 2
    err = capsys.readouterr().err
    assert f"resuming from {out / 'checkpoints' / 'global_step_2'} at step 2" in err


def test_no_checkpoint_and_another_config_is_refused(tiny_model_dir, tiny_data, tmp_path, capsys):
    """A run killed before its first checkpoint: the same config starts over (and says so);
    a different one is another run and is refused."""
    out = tmp_path / "run"
    Trainer(grpo_config(tiny_model_dir, tiny_data, out, steps=1, **{"trainer.save_freq": 1})).fit()
    import shutil

    shutil.rmtree(out / "checkpoints")
    other = {"actor_rollout_ref.rollout.n": 4}
    with pytest.raises(ConfigError, match="no checkpoint and a different config"):
        Trainer(grpo_config(tiny_model_dir, tiny_data, out, steps=1, **other))
    again = Trainer(
        grpo_config(tiny_model_dir, tiny_data, out, steps=1, **{"trainer.save_freq": 1})
    )
    assert again.step == 0
    assert "starting it over at step 0" in capsys.readouterr().err


def test_sft_refuses_a_used_dir(tiny_model_dir, tiny_data, tmp_path):
    """Pins: ``toolgrpo sft`` with resume=disable wrote over an earlier SFT run."""
    from tests.sft.test_sft import _sft_config
    from toolgrpo.sft.trainer import SFTTrainer

    out = tmp_path / "sft"
    SFTTrainer(_sft_config(tiny_model_dir, tiny_data, out, 1, "trainer.save_freq=1")).fit()
    with pytest.raises(ConfigError, match="holds another run"):
        SFTTrainer(_sft_config(tiny_model_dir, tiny_data, out, 1, "trainer.resume=disable"))
    moved = SFTTrainer(
        _sft_config(
            tiny_model_dir,
            tiny_data,
            out,
            1,
            "trainer.resume=disable",
            "trainer.overwrite_output_dir=true",
        )
    )
    assert moved.step == 0 and len(list(tmp_path.glob("sft.old-*"))) == 1
