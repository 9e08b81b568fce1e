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
import stat
import weakref
from pathlib import Path

from toolgrpo.errors import UserError
from toolgrpo.safe_io import path_kind

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


def _open_lock(path: Path) -> int:
    """The lock file's descriptor; a link, a FIFO or anything but a regular file is refused
    in one line that says what it is (``O_NONBLOCK``: opening a FIFO must not wait)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UserError(
                f"{path} is a symbolic link: toolgrpo does not follow links out of a run "
                "directory; remove it"
            ) from None
        raise UserError(
            f"cannot open the run lock {path} ({path_kind(path)}): {e.strerror or e}"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(
            f"the run lock {path} is {path_kind(path)}, not a regular file: remove it (toolgrpo "
            "creates it again)"
        )
    return fd


def lock_run_dir(run_dir: Path, key_name: str = "trainer.output_dir") -> RunLock:
    """Hold ``run_dir`` (created if missing) for this process, or raise ``RunLocked`` naming
    the process that holds it (and ``key_name``, the setting that chose it). Never blocks."""
    run_dir.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(run_dir)
    if key in _HELD:
        _HELD[key][1] += 1
        return RunLock(run_dir, key)
    path = run_dir / LOCK_FILE
    fd = _open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        who = _holder(fd)
        os.close(fd)
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise UserError(f"cannot lock {path}: {e.strerror or e}") from None
        raise RunLocked(
            f"another toolgrpo process ({who}) is writing {run_dir}: wait for it to end, or "
            f"choose another {key_name}"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[key] = [fd, 1]
    return RunLock(run_dir, key)


# What a training run writes at its start: a folder holding one of them is a run directory.
_RUN_MARKERS = ("config.yaml", "checkpoints", "metrics.jsonl")


def refuse_live_run_above(path: Path, key_name: str) -> None:
    """Raise ``RunLocked`` when a folder above ``path`` is a run directory another live
    process holds (``--rollout-data-dir RUN/rollout_data`` while RUN trains). Looks only:
    creates no lock file, and lets go of one it could take at once. A locked folder that is
    no run (another eval's output folder) does not count."""
    for parent in Path(os.path.realpath(path)).parents:
        lock = parent / LOCK_FILE
        if str(parent) in _HELD or not lock.is_file() or lock.is_symlink():
            continue
        if not any((parent / name).exists() for name in _RUN_MARKERS):
            continue
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            raise RunLocked(
                f"{path} is inside {parent}, which another toolgrpo process ({_holder(fd)}) is "
                f"writing: wait for it to end, or choose another {key_name}"
            ) from None
        finally:
            os.close(fd)
