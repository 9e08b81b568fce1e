"""A second process on a run directory: refused at once, by a lock that dies with its holder;
a checkpoint's cleanup never deletes what another live process is writing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import train_overrides
from tests.probes.conftest import one_error_line
from toolgrpo.trainer.checkpoint import write_checkpoint
from toolgrpo.trainer.run_lock import RunLocked, lock_run_dir

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
HOLD = (
    "import sys, time; from pathlib import Path; from toolgrpo.trainer.run_lock import "
    "lock_run_dir; lock = lock_run_dir(Path(sys.argv[1])); print('held', flush=True); "
    "time.sleep(600)"
)


def test_second_trainer_on_a_busy_output_dir_exits_2_in_one_line(
    tiny_model_dir, tiny_data, tmp_path
):
    """Pins: two trainers on one output_dir both ran to the end (metrics steps 1,1,2,2...)."""
    out = tmp_path / "run"
    lock = lock_run_dir(out)  # this process is the first trainer
    try:
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "toolgrpo.cli", "train"]
        cmd += train_overrides(tiny_model_dir, tiny_data, out, steps=1)
        proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
        elapsed = time.monotonic() - t0
    finally:
        lock.release()
    assert proc.returncode == 2, proc.stderr
    line = one_error_line(proc.stderr, "train")
    assert f"another toolgrpo process (pid {os.getpid()}) is writing {out}" in line
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()
    assert elapsed < 120  # refused before the model loads (the tokenizer and data only)


def test_the_lock_goes_with_a_killed_process(tmp_path):
    """A crashed holder leaves no stale lock: flock dies with the process."""
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLocked, match=rf"\(pid {holder.pid}\) is writing {out}"):
            lock_run_dir(out)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    lock_run_dir(out).release()  # free at once, nothing to clean up


def test_checkpoint_cleanup_spares_another_live_writer(tmp_path):
    """Pins: the stale-.tmp cleanup deleted every ``.tmp_global_step_*``, another process's
    checkpoint in the middle of being written included."""
    root = tmp_path / "run" / "checkpoints"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    live_pid, dead_pid = os.getppid(), int(dead.stdout)
    live = root / f".tmp_global_step_7_{live_pid}"
    stale = root / f".tmp_global_step_6_{dead_pid}"
    for d in (live, stale):
        d.mkdir(parents=True)
        (d / "weights").write_text("half written")
    write_checkpoint(tmp_path / "run", 1, {"global_step": 1}, lambda d: None)
    assert (live / "weights").read_text() == "half written"
    assert not stale.exists()
    assert (root / "global_step_1" / "trainer_state.json").is_file()
