"""The run lock says what its path is when it cannot be one: a FIFO at ``.toolgrpo.lock`` used
to give a traceback (``ftruncate`` on a pipe); a live run above a folder is seen without
creating a lock file there."""

from __future__ import annotations

import os

import pytest

from toolgrpo.errors import UserError
from toolgrpo.trainer.run_lock import LOCK_FILE, RunLocked, lock_run_dir, refuse_live_run_above


def test_a_fifo_lock_is_refused_in_one_line_saying_what_it_is(tmp_path):
    os.mkfifo(tmp_path / LOCK_FILE)
    with pytest.raises(UserError, match=r"is a FIFO \(named pipe\), not a regular file"):
        lock_run_dir(tmp_path)
    (tmp_path / LOCK_FILE).unlink()
    (tmp_path / LOCK_FILE).mkdir()
    with pytest.raises(UserError, match=r"\(a directory\)"):
        lock_run_dir(tmp_path)


def test_looking_above_creates_nothing(tmp_path):
    inner = tmp_path / "a" / "b"
    refuse_live_run_above(inner, "--rollout-data-dir")  # nothing held: no error
    assert not (tmp_path / LOCK_FILE).exists() and not inner.exists()
    held = lock_run_dir(tmp_path)  # this process's own hold is not another writer's
    try:
        refuse_live_run_above(inner, "--rollout-data-dir")
    finally:
        held.release()


def test_only_a_live_run_directory_above_counts(tmp_path):
    """Another eval's output folder (locked, no run in it) does not refuse a folder inside it;
    a live run directory (it holds its config.yaml) does."""
    import subprocess
    import sys

    hold = (
        "import sys, time; from pathlib import Path; from toolgrpo.trainer.run_lock import "
        "lock_run_dir; lock = lock_run_dir(Path(sys.argv[1])); print('held', flush=True); "
        "time.sleep(600)"
    )
    p = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path)], stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline().strip() == b"held"
        refuse_live_run_above(tmp_path / "sub" / "dumps", "--rollout-data-dir")
        (tmp_path / "config.yaml").write_text("")
        with pytest.raises(
            RunLocked, match=rf"inside {tmp_path}, which another .* \(pid {p.pid}\)"
        ):
            refuse_live_run_above(tmp_path / "sub" / "dumps", "--rollout-data-dir")
    finally:
        p.kill()
        p.wait(timeout=60)
