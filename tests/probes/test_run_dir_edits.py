"""A run directory edited by hand or by another program: links out of it, a file where the
directory should be, a tampered ``trainer_state.json``, lines in ``metrics.jsonl`` that are no
step's record. Nothing is written through a link; every refusal is one line naming the file."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import train_overrides
from tests.probes.conftest import one_error_line
from toolgrpo.cli import main
from toolgrpo.models.safe_load import CorruptCheckpoint
from toolgrpo.report.data import load_run
from toolgrpo.trainer.checkpoint import list_checkpoints, read_state
from toolgrpo.trainer.run_dir import RunDirError
from toolgrpo.trainer.summary import read_metrics
from toolgrpo.trainer.tracking import Tracker
from toolgrpo.trainer.trainer import Trainer

# What a hand (or a script) writes into trainer_state.json; each is a corrupt checkpoint.
HOSTILE_STATES = {
    "step_not_a_number": {"global_step": "abc"},
    "negative_step": {"global_step": -5},  # resumed, it wrote global_step_-4
    "step_of_another_dir": {"global_step": 7},
    "bool_step": {"global_step": True},
    "config_not_a_mapping": {"config": "garbage"},
    "sampler_not_a_mapping": {"sampler": [1, 2]},
    "sampler_negative": {"sampler": {"epoch": 0, "position": -2}},
    "is_lora_a_string": {"is_lora": "yes"},
    "base_not_a_mapping": {"base_model": "elsewhere"},
}

# Lines of metrics.jsonl that are no step's record: set aside on resume, skipped by readers.
HOSTILE_LINES = {
    "a_list": "[1, 2]",
    "a_string": '"step 3"',
    "step_not_a_number": '{"step": "abc", "val/all/accuracy": 0.3}',
    "negative_step": '{"step": -1, "reward/mean": 1.0}',
    "deep": "[" * 100_000,
}


def _tamper(ckpt, change):
    path = ckpt / "trainer_state.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))


@pytest.mark.parametrize("change", HOSTILE_STATES.values(), ids=HOSTILE_STATES.keys())
def test_tampered_trainer_state_is_a_corrupt_checkpoint(change, run_copy):
    ckpt = run_copy / "checkpoints" / "global_step_2"
    _tamper(ckpt, change)
    with pytest.raises(CorruptCheckpoint, match=r"trainer_state\.json"):
        read_state(ckpt)


def test_tampered_newest_checkpoint_falls_back_to_the_last_whole_one(run_copy, lora_config, capsys):
    """Pins: ``global_step: -5`` resumed at step -5 and wrote ``global_step_-4``."""
    _tamper(run_copy / "checkpoints" / "global_step_2", {"global_step": -5})
    trainer = Trainer(lora_config(run_copy, steps=2))
    assert trainer.step == 1
    assert "global_step is -5" in capsys.readouterr().err
    assert [s for s, _ in list_checkpoints(run_copy)] == [1]  # global_step_2 set aside
    assert (run_copy / "checkpoints" / "global_step_2.corrupt").is_dir()


def test_no_whole_checkpoint_left_is_one_line(run_copy, tiny_model_dir, tiny_data, capsys):
    """Pins: ``"config": "garbage"`` raised AttributeError on resume."""
    for step in (1, 2):
        _tamper(run_copy / "checkpoints" / f"global_step_{step}", {"config": "garbage"})
    args = ["train", *train_overrides(tiny_model_dir, tiny_data, run_copy, steps=3)]
    assert main([*args, "actor_rollout_ref.model.lora_rank=4"]) == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "no intact checkpoint" in line and "trainer_state.json: config is str" in line


@pytest.mark.parametrize("bad", HOSTILE_LINES.values(), ids=HOSTILE_LINES.keys())
def test_bad_metrics_line_is_set_aside_on_resume(bad, run_copy, capsys):
    """Pins: a ``[1,2]`` line broke resume (AttributeError) and ``toolgrpo report``."""
    metrics = run_copy / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([lines[0], bad, *lines[1:]]) + "\n")
    assert [r["step"] for r in read_metrics(metrics)] == [1, 2]
    assert [r["step"] for r in load_run(run_copy).metrics] == [1, 2]
    assert main(["report", str(run_copy)]) == 0
    Tracker(run_copy, ["jsonl"], total_steps=3, start_step=1).close()  # resume from step 1
    assert metrics.read_text().splitlines() == [lines[0]]
    assert (run_copy / "metrics.jsonl.rejected").read_text() == bad + "\n"
    assert "set aside 1 line(s)" in capsys.readouterr().err


def test_symlinked_metrics_is_refused_and_its_target_untouched(run_copy, lora_config, tmp_path):
    """Pins: on resume, a metrics.jsonl linking elsewhere had its target rewritten."""
    target = tmp_path / "precious.jsonl"
    target.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n')
    (run_copy / "metrics.jsonl").unlink()
    (run_copy / "metrics.jsonl").symlink_to(target)
    with pytest.raises(RunDirError, match="metrics.jsonl is a symbolic link"):
        Trainer(lora_config(run_copy, steps=1))  # resume from step 1 would drop steps 2, 3
    assert target.read_text() == '{"step": 1}\n{"step": 2}\n{"step": 3}\n'


def test_link_planted_mid_run_is_not_written_through(tmp_path):
    out = tmp_path / "run"
    tracker = Tracker(out, ["jsonl"], total_steps=2)
    tracker.log({"x": 1.0}, 1)
    target = tmp_path / "precious.txt"
    target.write_text("mine\n")
    (out / "metrics.jsonl").unlink()
    (out / "metrics.jsonl").symlink_to(target)
    with pytest.raises(RunDirError, match="became a symbolic link"):
        tracker.log({"x": 2.0}, 2)
    assert target.read_text() == "mine\n"


def test_symlinked_output_dir_with_overwrite_moves_the_run_not_the_link(
    run_copy, lora_config, tmp_path
):
    """Pins: the link's target was moved aside, then ``mkdir`` on the dangling link raised
    FileExistsError."""
    link = tmp_path / "link"
    link.symlink_to(run_copy)
    extra = {"trainer.resume": "disable", "trainer.overwrite_output_dir": "true"}
    trainer = Trainer(lora_config(link, steps=1, **extra))
    assert trainer.step == 0 and trainer.out == run_copy.resolve()
    assert link.is_symlink() and os.readlink(link) == str(run_copy) and run_copy.is_dir()
    (old,) = tmp_path.glob("run.old-*")
    assert [s for s, _ in list_checkpoints(old)] == [1, 2]


def test_output_dir_that_is_a_file_is_one_line(
    tiny_model_dir, tiny_data, tmp_path, capsys, no_model
):
    """Pins: a traceback (FileExistsError from mkdir)."""
    out = tmp_path / "notes.txt"
    out.write_text("not a run")
    assert main(["train", *train_overrides(tiny_model_dir, tiny_data, out, steps=1)]) == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert f"trainer.output_dir={out} is a file, not a directory" in line
    assert out.read_text() == "not a run"
