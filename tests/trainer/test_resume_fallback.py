"""Issue 15 item 7 (corrupt checkpoints): resume falls back past a corrupt newest checkpoint to
the previous intact one, saying so and keeping the corrupt one aside; none intact is one line."""

from __future__ import annotations

import pytest

from tests.conftest import read_metrics
from tests.trainer.ckpt_runs import copy_run, finished_run, grpo_config
from toolgrpo.models.safe_load import CheckpointError
from toolgrpo.trainer.checkpoint import list_checkpoints
from toolgrpo.trainer.trainer import Trainer


@pytest.fixture(scope="module")
def base_run(tiny_model_dir, tiny_data, tmp_path_factory):
    return finished_run(tiny_model_dir, tiny_data, tmp_path_factory.mktemp("base") / "run")


def _truncate(f):
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 3])


def _break_weights(ckpt):
    _truncate(next((ckpt / "model").glob("*.safetensors")))


def _break_state(ckpt):
    (ckpt / "trainer_state.json").write_text('{"global_step": 2, "samp')


def _drop_optimizer(ckpt):
    (ckpt / "optimizer.pt").unlink()


@pytest.mark.parametrize("damage", [_break_weights, _break_state, _drop_optimizer])
def test_corrupt_newest_falls_back(damage, base_run, tiny_model_dir, tiny_data, tmp_path, capsys):
    """Pins: a truncated model.safetensors, torn trainer_state.json or missing optimizer.pt in
    the newest checkpoint ended resume in a traceback."""
    out = copy_run(base_run, tmp_path / "run")
    damage(out / "checkpoints" / "global_step_2")
    trainer = Trainer(
        grpo_config(tiny_model_dir, tiny_data, out, steps=2, **{"trainer.save_freq": 1})
    )
    assert trainer.step == 1
    err = capsys.readouterr().err
    assert "checkpoint global_step_2 is unusable" in err
    assert "resuming from global_step_1 instead" in err
    assert (out / "checkpoints" / "global_step_2.corrupt").is_dir()  # kept, out of the way
    trainer.fit()
    assert [r["step"] for r in read_metrics(out)] == [1, 2]
    assert [s for s, _ in list_checkpoints(out)] == [1, 2]


def test_no_intact_checkpoint_is_one_line(base_run, tiny_model_dir, tiny_data, tmp_path):
    out = copy_run(base_run, tmp_path / "run")
    _break_weights(out / "checkpoints" / "global_step_2")
    _drop_optimizer(out / "checkpoints" / "global_step_1")
    with pytest.raises(CheckpointError, match="no intact checkpoint") as err:
        Trainer(grpo_config(tiny_model_dir, tiny_data, out, steps=3))
    assert "\n" not in str(err.value)
    assert (out / "checkpoints" / "global_step_2").is_dir()  # nothing moved when none is intact


def test_sft_falls_back_too(tiny_model_dir, tiny_data, tmp_path, capsys):
    from tests.sft.test_sft import _sft_config
    from toolgrpo.sft.trainer import SFTTrainer

    out = tmp_path / "sft"
    cfg = _sft_config(
        tiny_model_dir, tiny_data, out, 2, "trainer.save_freq=1", "trainer.max_checkpoints=2"
    )
    SFTTrainer(cfg).fit()
    _truncate(out / "checkpoints" / "global_step_2" / "adapter" / "adapter_model.safetensors")
    assert SFTTrainer(cfg).step == 1
    assert "resuming from global_step_1 instead" in capsys.readouterr().err
