"""What a run says at its start: a resume with no step left says so in one line (it used to
print "steps 31-6" and train nothing without a word)."""

from __future__ import annotations

from types import SimpleNamespace

from toolgrpo.config.loader import load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.trainer.summary import nothing_left, startup_lines


def _trainer(step: int, total: int) -> SimpleNamespace:
    cfg = load_config(TrainConfig, None, [f"trainer.total_training_steps={total}"])
    policy = SimpleNamespace(is_lora=False, dtype="torch.float32")
    return SimpleNamespace(
        cfg=cfg, policy=policy, generator=object(), pool=None, total_steps=total, step=step,
        tasks=[1, 2], out="outputs/run",
    )  # fmt: skip


def test_a_resume_past_the_last_step_says_nothing_is_left():
    lines = startup_lines(_trainer(31, 6))
    assert not any("steps 31-6" in line for line in lines)
    (said,) = [line for line in lines if line.startswith("nothing left to train")]
    assert "at step 31 of 6" in said and "trainer.total_training_steps" in said
    assert nothing_left(6, 6) and nothing_left(5, 6) == []


def test_a_resume_with_steps_left_names_them():
    lines = startup_lines(_trainer(3, 6))
    assert any("steps 4-6" in line for line in lines)
    assert not any(line.startswith("nothing left") for line in lines)
