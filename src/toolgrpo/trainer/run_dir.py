"""A run directory is data a user (or another program) may have touched: its path is resolved
once, links inside it are refused, every file is written in place without following a link,
and ``metrics.jsonl`` is read line by line, a line that is not a step's record set aside."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from toolgrpo import safe_io
from toolgrpo.errors import UserError
from toolgrpo.trainer.run_lock import LOCK_FILE

METRICS_FILE = "metrics.jsonl"
REJECTED_SUFFIX = ".rejected"  # metrics.jsonl.rejected: lines set aside on resume
# What toolgrpo writes at the top of a run directory: none may be a link out of it.
RUN_ENTRIES = (
    METRICS_FILE,
    "config.yaml",
    "checkpoints",
    "tensorboard",
    "sft_result.json",
    "adapter",  # toolgrpo sft's final outputs
    "model",
    LOCK_FILE,
)


class RunDirError(UserError):
    """A run directory toolgrpo refuses to write (a file, a link out of it)."""


def resolve_output_dir(out: Path, key: str = "trainer.output_dir") -> Path:
    """The real directory behind ``out``: a symlink is followed once, here, so nothing later
    (moving an old run aside, recreating the directory) acts on the link instead of the run."""
    if out.is_symlink() and not out.exists():
        raise RunDirError(f"{key}={out} is a broken symbolic link (to {os.readlink(out)})")
    real = out.resolve()
    if real.exists() and not real.is_dir():
        raise RunDirError(f"{key}={out} is a file, not a directory: choose another {key}")
    for parent in real.parents:
        if parent.exists() and not parent.is_dir():
            raise RunDirError(f"{key}={out}: {parent} is a file, not a directory")
    return real


def refuse_links(out: Path) -> None:
    """Refuse a run directory where a file toolgrpo writes is a symbolic link: writing through
    it would change a file elsewhere (``metrics.jsonl`` -> someone's data)."""
    for name in RUN_ENTRIES:
        p = out / name
        if p.is_symlink():
            raise RunDirError(
                f"{p} is a symbolic link (to {os.readlink(p)}): toolgrpo writes a run's files "
                "in place and never through a link out of the run directory; replace it with "
                "a regular file or directory, or point trainer.output_dir elsewhere"
            )


def write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (``safe_io``): a kill leaves the old or new
    file whole, and a link at ``path`` is refused, never written through."""
    safe_io.write_text(path, text)


def append_line(path: Path, line: str) -> None:
    """Append one line; refused (ELOOP) if ``path`` has become a link since the run started."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        if os.path.islink(path):
            raise RunDirError(f"{path} became a symbolic link: not written through") from e
        raise
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def as_record(line: str) -> tuple[dict[str, Any] | None, str]:
    """A metrics line as its record, or ``None`` and why not: a JSON object whose ``step`` is a
    whole number >= 0 (a torn line, ``[1, 2]`` or ``{"step": "abc"}`` are not)."""
    try:
        rec = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return None, "not JSON (a torn line?)"
    if not isinstance(rec, dict):
        return None, f"a JSON {type(rec).__name__}, not an object"
    step = rec.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return None, f"its step is {step!r}, not a whole number >= 0"
    return rec, ""


def _lines(path: Path) -> Iterator[tuple[int, str, dict[str, Any] | None, str]]:
    """Each non-blank line of a metrics file: (line number, text, record or None, why not)."""
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if line.strip():
            rec, why = as_record(line)
            yield n, line, rec, why


def read_records(path: Path) -> tuple[list[dict[str, Any]], list[tuple[int, str, str]]]:
    """Every step record of a metrics file, and the other lines: (line number, text, why)."""
    records: list[dict[str, Any]] = []
    bad: list[tuple[int, str, str]] = []
    if not path.is_file():
        return records, bad
    for n, line, rec, why in _lines(path):
        if rec is None:
            bad.append((n, line, why))
        else:
            records.append(rec)
    return records, bad


def truncate_metrics(path: Path, last_step: int) -> list[tuple[int, str, str]]:
    """Keep the records with ``step <= last_step`` (resume from that step). Lines that are not
    records are appended to ``metrics.jsonl.rejected`` and returned; the file is replaced
    atomically, so a link never has its target rewritten."""
    if not path.is_file():
        return []
    kept: list[str] = []
    bad: list[tuple[int, str, str]] = []
    for n, line, rec, why in _lines(path):
        if rec is None:
            bad.append((n, line, why))
        elif rec["step"] <= last_step:
            kept.append(line + "\n")
    rejected = path.with_name(path.name + REJECTED_SUFFIX)
    for _, text, _ in bad:
        append_line(rejected, text)
    write_text(path, "".join(kept))
    return bad
