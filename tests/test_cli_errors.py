"""SIGTERM (a scheduler preempting the job) stops a run as Ctrl-C does: one line naming the
checkpoint to resume from, exit 143. It used to exit silently with 143 and no such line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from toolgrpo.cli_errors import Terminated, sigterm_as_interrupt

SRC = Path(__file__).resolve().parents[1] / "src"

# A ``toolgrpo train`` whose trainer writes checkpoint 3, says so, then waits to be preempted.
PREEMPTED = textwrap.dedent(
    """
    import sys, time
    import toolgrpo.trainer.trainer as t
    from toolgrpo.cli import main
    from toolgrpo.trainer.checkpoint import write_checkpoint

    class Trainer:
        def __init__(self, cfg):
            self.cfg = cfg
        def fit(self):
            write_checkpoint(self.cfg.trainer.output_dir, 3, {"global_step": 3}, lambda d: None)
            print("checkpointed", flush=True)
            time.sleep(120)
        def close(self):
            print("closed", flush=True)

    t.Trainer = Trainer
    sys.exit(main(["train", "trainer.output_dir=" + sys.argv[1]]))
    """
)


def test_sigterm_is_one_line_naming_the_checkpoint_and_exit_143(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", PREEMPTED, str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "checkpointed"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert "closed" in out  # the trainer's cleanup ran, as after Ctrl-C
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [
        f"toolgrpo train: terminated (SIGTERM); run the same command again to resume from "
        f"{tmp_path}/checkpoints/global_step_3 (trainer.resume=auto)"
    ], err


def test_sigterm_handler_is_undone_and_leaves_others_alone():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated), sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs at the next bytecode boundary
            pass
    assert signal.getsignal(signal.SIGTERM) == before
    assert isinstance(Terminated(), KeyboardInterrupt)  # every Ctrl-C path handles it

    def mine(signum, frame):
        pass

    signal.signal(signal.SIGTERM, mine)
    try:
        with sigterm_as_interrupt():  # someone else's handler: not replaced
            assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)
