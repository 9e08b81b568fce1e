"""Live progress (issue #20 item 3): inside-step phases, the step-0 held-out line, the end-of-run
summary and ``toolgrpo eval``'s progress. On main a step printed only ``step N: ...`` after it
ended, the step-0 line was an empty ``step 0:``, and eval printed nothing until it finished."""

from __future__ import annotations

import threading

from tests.conftest import train_overrides
from toolgrpo import progress
from toolgrpo.cli import main
from toolgrpo.trainer.trainer import Trainer


class FakeBars:
    def __init__(self):
        self.tasks, self.done = {}, {}

    def add_task(self, name, total):
        self.tasks[len(self.tasks)] = (name, total)
        self.done[len(self.done)] = 0
        return len(self.tasks) - 1

    def advance(self, handle, n):
        self.done[handle] += n

    def remove_task(self, handle):
        self.tasks.pop(handle)


class Lines:
    is_terminal = False

    def __init__(self):
        self.lines = []

    def print(self, text, **kwargs):
        self.lines.append(text)


def test_phases_of_two_threads_do_not_mix_and_live_bars_end():
    """Asynchronous rollouts: the rollout thread generates while the main thread updates."""
    bars, console = FakeBars(), Lines()
    console.is_terminal = True
    rep = progress.Reporter(console, bars)
    rep.label = "step 2"
    old = progress.set_reporter(rep)
    inside, release = threading.Event(), threading.Event()

    def rollout_thread():
        with progress.phase("generation", 8, "episodes"):
            for _ in range(8):
                progress.tick()
            inside.set()
            release.wait(10)

    try:
        t = threading.Thread(target=rollout_thread)
        t.start()
        inside.wait(10)
        with progress.phase("update", 2, "mini-batches"):
            progress.tick()
            assert bars.tasks == {0: ("step 2 generation", 8), 1: ("step 2 update", 2)}
            assert bars.done == {0: 8, 1: 1}
        release.set()
        t.join()
    finally:
        progress.set_reporter(old)
    assert bars.tasks == {} and console.lines == []  # the bars are gone, no line printed


def test_without_a_terminal_one_line_per_phase_and_no_reporter_is_silent():
    console = Lines()
    old = progress.set_reporter(progress.Reporter(console, FakeBars()))
    try:
        with progress.phase("update", 3, "mini-batches"):
            progress.tick(2)
    finally:
        progress.set_reporter(old)
    assert len(console.lines) == 1 and console.lines[0].startswith("update: 2/3 mini-batches in ")
    progress.tick()  # nothing installed: a no-op
    with progress.phase("x", 1):
        progress.tick()


def test_training_shows_phases_held_out_step_zero_and_a_summary(
    make_train_config, tmp_path, capsys
):
    cfg = make_train_config(
        steps=2,
        **{
            "trainer.logger": "[console,jsonl]",
            "trainer.val_before_train": "true",
            "trainer.test_freq": "2",
            "data.val_max_samples": "2",
        },
    )
    Trainer(cfg).fit()
    err = capsys.readouterr().err
    step0 = next(line for line in err.splitlines() if line.startswith("step 0:"))
    assert "val/reward/mean=" in step0 and "val/format_rate=" in step0
    assert "step 0 validation: 2 samples in " in err
    assert "step 1 generation: 4 samples in " in err
    assert "step 1 update: 1 mini-batches in " in err
    assert "step 2 validation: 2 samples in " in err
    assert "best held-out val/reward/mean = " in err
    assert f"toolgrpo report {tmp_path / 'run'}" in err
    assert "latest checkpoint: " in err


def test_eval_shows_progress(tiny_model_dir, tiny_data, tmp_path, capsys):
    ov = train_overrides(tiny_model_dir, tiny_data, tmp_path / "ev", 1)
    assert main(["eval", "--limit", "3", *ov]) == 0
    assert "eval generation: 3 samples in " in capsys.readouterr().err
