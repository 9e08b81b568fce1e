"""One writer per run directory: an advisory ``flock`` on ``<run>/.toolgrpo.lock``.

Two processes on one ``trainer.output_dir`` interleave their metrics lines and checkpoints, and
one's cleanup can delete the checkpoint the other is writing. The lock lives exactly as long as
the open file that holds it: it goes with the process on any exit (a crash or SIGKILL too), so
there is never a stale lock to remove by hand. The file holds the holder's pid, to name it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import weakref
from pathlib import Path

from toolgrpo.errors import UserError

LOCK_FILE = ".toolgrpo.lock"

# Run directories this process holds: realpath -> [fd, holders]. A process may open one run
# twice (tests, a notebook re-creating a trainer); the lock guards against other processes.
_HELD: dict[str, list[int]] = {}


class RunLocked(UserError):
    """Another process holds the run directory."""


class RunLock:
    """This process's hold on a run directory; ``release`` (or garbage collection) lets go."""

    def __init__(self, run_dir: Path, key: str) -> None:
        self.run_dir = run_dir
        self._finalizer = weakref.finalize(self, _drop, key)

    @property
    def held(self) -> bool:
        return self._finalizer.alive

    def release(self) -> None:
        self._finalizer()


def _drop(key: str) -> None:
    entry = _HELD.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] <= 0:
        del _HELD[key]
        os.close(entry[0])  # closing the last descriptor releases the flock


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return f"pid {text}" if text.isdigit() else "pid unknown"


def lock_run_dir(run_dir: Path) -> RunLock:
    """Hold ``run_dir`` (created if missing) for this process, or raise ``RunLocked`` naming
    the process that holds it. Never blocks."""
    run_dir.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(run_dir)
    if key in _HELD:
        _HELD[key][1] += 1
        return RunLock(run_dir, key)
    path = run_dir / LOCK_FILE
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UserError(
                f"{path} is a symbolic link: toolgrpo does not follow links out of a run "
                "directory; remove it"
            ) from None
        raise UserError(f"cannot open the run lock {path}: {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        who = _holder(fd)
        os.close(fd)
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise UserError(f"cannot lock {path}: {e.strerror or e}") from None
        raise RunLocked(
            f"another toolgrpo process ({who}) is writing {run_dir}: wait for it to end, or "
            "choose another trainer.output_dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[key] = [fd, 1]
    return RunLock(run_dir, key)
