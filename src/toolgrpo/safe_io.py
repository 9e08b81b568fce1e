"""Every file toolgrpo writes for a user (a report, an eval JSON, rollout dumps, a run log,
labels, benchmark results) goes through here, so none is written through a symbolic link.

A link planted at the destination, or at the name of its temporary, would have its target
replaced by the page or the JSON. A file is written to a temporary that is created, never
opened (``O_EXCL``, a fresh random name), then renamed into place; a link at the destination
itself is refused in one line naming it. Appends open with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import IO

from toolgrpo.errors import UserError

# The process's umask, read once at import (reading it means setting it, which races threads).
_UMASK = os.umask(0o022)
os.umask(_UMASK)


class LinkRefused(UserError):
    """A file toolgrpo would write is a symbolic link: never written through."""


def _refusal(path: Path) -> LinkRefused:
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return LinkRefused(
        f"{path} is a symbolic link{target}: toolgrpo never writes through a link; remove it "
        "or write somewhere else"
    )


def refuse_link(path: str | Path) -> None:
    """Raise ``LinkRefused`` when ``path`` is a symbolic link (a broken one too)."""
    p = Path(path)
    if p.is_symlink():
        raise _refusal(p)


def write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Replace ``path`` with ``text`` atomically: a temporary beside it, then a rename, so a
    reader (or a kill) sees the old file or the new one whole. Its folder is created."""
    p = Path(path)
    refuse_link(p)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding=encoding) as fh:
            fh.write(text)
        refuse_link(p)  # planted while we wrote: os.replace would put the file in its place
        os.chmod(tmp, 0o666 & ~_UMASK)  # as an ordinary write would create it
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def open_append(path: str | Path, encoding: str = "utf-8") -> IO[str]:
    """``path`` opened to append (created if missing), never through a link."""
    p = Path(path)
    try:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(p, flags, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP or p.is_symlink():
            raise _refusal(p) from None
        raise
    return os.fdopen(fd, "a", encoding=encoding)


def path_kind(path: str | Path) -> str:
    """What a path is, for a message that refuses it: "a directory", "a FIFO (named pipe)"..."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    kinds = (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISREG, "a regular file"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")
