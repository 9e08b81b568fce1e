"""The run lock says what its path is when it cannot be one: a FIFO at ``.toolgrpo.lock`` used
to give a traceback (``ftruncate`` on a pipe); a live run above a folder is seen without
creating a lock file there."""

from __future__ import annotations

import os

import pytest

from toolgrpo.errors import UserError
from toolgrpo.trainer.run_lock import LOCK_FILE, lock_run_dir, refuse_live_run_above


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
