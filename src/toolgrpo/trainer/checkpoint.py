"""Checkpoints that survive SIGKILL: written to a temp dir and renamed into place, so a checkpoint
either exists whole or not at all, and resume always finds the last complete one."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from toolgrpo.models.safe_load import CorruptCheckpoint, load_torch_file

STEP_DIR = re.compile(r"^global_step_(\d+)$")
STATE_FILE = "trainer_state.json"


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


def write_checkpoint(
    output_dir: str | Path,
    step: int,
    state: dict[str, Any],
    write_payload: Any,
    keep: int = 2,
) -> Path:
    """Create ``global_step_{step}``: ``write_payload(tmp_dir)`` writes weights, then the state
    file, then one rename publishes it. Older checkpoints beyond ``keep`` are removed afterwards."""
    root = checkpoint_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"global_step_{step}"
    tmp = root / f".tmp_global_step_{step}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write_payload(tmp)
    (tmp / STATE_FILE).write_text(json.dumps(state, indent=1, default=str))
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    _fsync_dir(root)
    if keep > 0:
        for _, old in list_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp_global_step_*"):
        shutil.rmtree(stale, ignore_errors=True)
    return final


def read_state(ckpt: Path) -> dict[str, Any]:
    """The checkpoint's ``trainer_state.json``; a torn or incomplete one is a corrupt checkpoint."""
    path = ckpt / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptCheckpoint(f"{path} is unreadable ({type(e).__name__})") from None
    if not isinstance(state, dict):
        raise CorruptCheckpoint(f"{path} is not a JSON object")
    missing = [k for k in ("global_step", "sampler", "is_lora") if k not in state]
    if missing:
        raise CorruptCheckpoint(f"{path} lacks {', '.join(missing)}")
    return state


def save_torch(obj: Any, path: Path) -> None:
    torch.save(obj, path)


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
