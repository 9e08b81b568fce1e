"""Checkpoints that survive SIGKILL: written to a temp dir and renamed into place, so a checkpoint
either exists whole or not at all, and resume always finds the last complete one."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from toolgrpo.errors import UserError
from toolgrpo.models.identity import BASE_KEY
from toolgrpo.models.safe_load import CorruptCheckpoint, load_torch_file

STEP_DIR = re.compile(r"^global_step_(\d+)$")
STATE_FILE = "trainer_state.json"
TMP_PREFIX = ".tmp_global_step_"  # + step_pid: a checkpoint being written


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = STEP_DIR.match(d.name)
        if m and (d / STATE_FILE).is_file():
            found.append((int(m.group(1)), d))
    return sorted(found)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(output_dir)
    return ckpts[-1][1] if ckpts else None


class DiskFull(UserError):
    """A checkpoint that could not be written for lack of space; the earlier ones are kept."""


def write_checkpoint(
    output_dir: str | Path,
    step: int,
    state: dict[str, Any],
    write_payload: Any,
    keep: int = 2,
) -> Path:
    """Create ``global_step_{step}``: ``write_payload(tmp_dir)`` writes weights, then the state
    file, then one rename publishes it. Older checkpoints beyond ``keep`` are removed afterwards.
    A write that fails leaves no partial directory behind; a full disk is a one-line
    ``DiskFull``. Only this process's temp directories (or a dead process's) are cleaned up."""
    root = checkpoint_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"global_step_{step}"
    tmp = root / f"{TMP_PREFIX}{step}_{os.getpid()}"
    _remove(tmp)
    tmp.mkdir()
    try:
        write_payload(tmp)
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1, default=str))
        _fsync_dir(tmp)
    except BaseException as e:
        full = isinstance(e, Exception) and _no_space(e)
        why = _reason(e, root) if full else ""  # the space left before the cleanup frees it
        _remove(tmp)
        if full:
            last = latest_checkpoint(output_dir)
            kept = f"the last whole checkpoint, {last}, is kept" if last else "none was kept"
            raise DiskFull(
                f"disk full: checkpoint {final.name} could not be written in {root} "
                f"({why}); the partial one was removed and {kept}: free space, "
                "then run the same command to resume"
            ) from e
        raise
    _remove(final)
    tmp.rename(final)
    _fsync_dir(root)
    if keep > 0:
        for _, old in list_checkpoints(output_dir)[:-keep]:
            _remove(old)
    for stale in root.glob(f"{TMP_PREFIX}*"):
        if _abandoned(stale):
            _remove(stale)
    return final


def _no_space(e: BaseException) -> bool:
    """ENOSPC/EDQUOT, or what torch's and safetensors' writers make of it (``unexpected pos``,
    ``No space left on device (os error 28)``), anywhere in the exception's chain."""
    for seen in _chain(e):
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(m in str(seen) for m in _NO_SPACE_MARKS):
            return True
    return False


def _chain(e: BaseException) -> list[BaseException]:
    """``e`` and the exceptions it was raised from or during, each once."""
    out: list[BaseException] = []
    seen: BaseException | None = e
    while seen is not None and seen not in out:
        out.append(seen)
        seen = seen.__cause__ or seen.__context__
    return out


_NO_SPACE_MARKS = (
    "No space left on device",
    "os error 28",
    "Disk quota exceeded",
    "unexpected pos",
)


def _reason(e: BaseException, root: Path) -> str:
    """What failed, in words, with the space left where the checkpoint was written."""
    oserrors = [x for x in _chain(e) if isinstance(x, OSError) and x.strerror]
    if oserrors:
        why = oserrors[0].strerror + (f": {oserrors[0].filename}" if oserrors[0].filename else "")
    elif "unexpected pos" in str(e):  # torch's writer: a short write, the errno lost
        why = "the write stopped short"
    else:
        why = "No space left on device"
    try:
        free = shutil.disk_usage(root).free / 2**20
    except OSError:
        return why
    return f"{why}; {free:.0f} MiB free"


def _abandoned(tmp: Path) -> bool:
    """A temp checkpoint of this process, or of one no longer running: never another live
    writer's (which would lose the checkpoint it is writing)."""
    pid = tmp.name.rsplit("_", 1)[-1]
    if not pid.isdigit() or int(pid) == os.getpid():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, someone else's
        return False
    return False


def _remove(p: Path) -> None:
    """Remove a directory tree we wrote; a link is removed itself, its target never touched."""
    if p.is_symlink() or p.is_file():
        p.unlink(missing_ok=True)
    elif p.exists():
        shutil.rmtree(p, ignore_errors=True)


def read_state(ckpt: Path) -> dict[str, Any]:
    """The checkpoint's ``trainer_state.json``; a torn, incomplete or edited one (a step that is
    not a whole number, a config that is not a mapping) is a corrupt checkpoint."""
    path = ckpt / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CorruptCheckpoint(f"{path} is unreadable ({type(e).__name__})") from None
    if not isinstance(state, dict):
        raise CorruptCheckpoint(f"{path} is not a JSON object")
    missing = [k for k in ("global_step", "sampler", "is_lora") if k not in state]
    if missing:
        raise CorruptCheckpoint(f"{path} lacks {', '.join(missing)}")
    problem = _state_problem(state, ckpt.name)
    if problem:
        raise CorruptCheckpoint(f"{path}: {problem}")
    return state


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _state_problem(state: dict[str, Any], dir_name: str) -> str:
    step = state["global_step"]
    if not _count(step):
        return f"global_step is {step!r}, not a whole number >= 0"
    m = STEP_DIR.match(dir_name)
    if m and int(m.group(1)) != step:
        return f"global_step is {step}, but the directory is {dir_name}"
    sampler = state["sampler"]
    if not (isinstance(sampler, dict) and set(sampler) == {"epoch", "position"}) or not all(
        _count(v) for v in sampler.values()
    ):
        return f"sampler is {str(sampler)[:80]}, not {{epoch, position}} whole numbers"
    if not isinstance(state["is_lora"], bool):
        return f"is_lora is {state['is_lora']!r}, not true or false"
    for key in ("config", BASE_KEY):
        if state.get(key) is not None and not isinstance(state[key], dict):
            return f"{key} is {type(state[key]).__name__} {str(state[key])[:40]!r}, not a mapping"
    return ""


def save_torch(obj: Any, path: Path) -> None:
    # Through a Python file: a full disk is an OSError (ENOSPC), not "unexpected pos".
    with open(path, "wb") as fh:
        torch.save(obj, fh)


def load_torch(path: Path) -> Any:
    """Tensors and plain containers only: a crafted pickle is refused, never run."""
    return load_torch_file(path)


def _fsync_dir(d: Path) -> None:
    for f in d.iterdir():
        if f.is_file():
            with f.open("rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
