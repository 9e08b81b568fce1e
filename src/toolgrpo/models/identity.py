"""Which base model a checkpoint belongs to: a LoRA adapter (or a full model's trained weights
resumed onto a base) means nothing on another base of the same shape, and would load silently.

Every checkpoint records its base's identity in ``trainer_state.json`` (``base_model``): the path
and a hash of ``config.json``, the weights' index, each weight file's name and size, and three
64 KiB samples of each (two bases of one architecture, e.g. base and instruct, share config and
sizes). Reading well under a megabyte, it is cheap for any model size.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from toolgrpo.errors import UserError

log = logging.getLogger(__name__)

BASE_KEY = "base_model"  # in trainer_state.json
# Beside a final adapter (``toolgrpo sft``'s ``adapter/``), which has no trainer_state.json: the
# record travels with the directory, so the adapter is checked wherever it is loaded.
ADAPTER_BASE_FILE = "toolgrpo_base.json"
_INDEXES = ("config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json")
_WEIGHTS = ("*.safetensors", "*.bin")
_SAMPLE = 1 << 16


class BaseModelMismatch(UserError):
    """A checkpoint used with a base model other than the one it was trained on."""


def model_hash(model_dir: Path) -> str:
    """A short content hash of a model directory (see the module docstring)."""
    h = hashlib.sha256()
    for name in _INDEXES:
        p = model_dir / name
        if p.is_file():
            h.update(f"{name}\0".encode() + p.read_bytes())
    files = sorted({f for pattern in _WEIGHTS for f in model_dir.glob(pattern) if f.is_file()})
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}\0{size}\0".encode())
        with f.open("rb") as fh:
            for offset in sorted({0, size // 2, max(0, size - _SAMPLE)}):
                fh.seek(offset)
                h.update(fh.read(_SAMPLE))
    return h.hexdigest()[:16]


def base_identity(model_path: str, hf_dir: Path) -> dict[str, str]:
    """What a checkpoint records of its base: the path as configured, the directory it
    resolved to, and its hash."""
    return {"path": str(model_path), "dir": str(hf_dir), "hash": model_hash(Path(hf_dir))}


def check_base(ckpt: Path, recorded: Any, current: dict[str, str], key: str) -> None:
    """Refuse (one line naming both) a checkpoint whose recorded base differs from ``current``;
    a checkpoint from before the record is used with a warning."""
    if not isinstance(recorded, dict) or not recorded.get("hash"):
        log.warning(
            "%s does not record its base model (written by an older toolgrpo): cannot check "
            "that it belongs to %s",
            ckpt,
            current["path"],
        )
        return
    if recorded["hash"] == current["hash"]:
        return
    old = recorded.get("path") or recorded.get("dir") or "?"
    if recorded.get("dir") == current["dir"]:
        raise BaseModelMismatch(
            f"{ckpt} was trained on the model at {current['dir']}, which has changed since "
            f"(hash {recorded['hash']} then, {current['hash']} now): restore that model, or "
            "start a new run"
        )
    raise BaseModelMismatch(
        f"{ckpt} was trained on base model {old} (hash {recorded['hash']}), not on {key}="
        f"{current['path']} (hash {current['hash']}): set {key}={old}"
    )


def check_checkpoint_base(ckpt: Path, model_path: str, hf_dir: Path, key: str) -> None:
    """``check_base`` for checkpoint directory ``ckpt`` (its ``trainer_state.json`` record; an
    unreadable one counts as no record) against the base at ``model_path`` (``hf_dir``)."""
    try:
        state = json.loads((ckpt / "trainer_state.json").read_text())
    except (OSError, ValueError, RecursionError):
        state = None
    recorded = state.get(BASE_KEY) if isinstance(state, dict) else None
    check_base(ckpt, recorded, base_identity(model_path, hf_dir), key)


def record_adapter_base(adapter_dir: Path, model_path: str, hf_dir: Path) -> None:
    """Write the base's identity into a saved adapter's directory (``ADAPTER_BASE_FILE``)."""
    rec = base_identity(model_path, hf_dir)
    (Path(adapter_dir) / ADAPTER_BASE_FILE).write_text(json.dumps(rec, indent=1) + "\n")


def check_adapter_record(adapter_dir: Path, model_path: str, hf_dir: Path, key: str) -> None:
    """Refuse an adapter whose ``ADAPTER_BASE_FILE`` names another base than the one it is
    being loaded on. Adapters without the file (shipped ones, a user's own, checkpoints' which
    record their base in trainer_state.json) are not checked here."""
    f = Path(adapter_dir) / ADAPTER_BASE_FILE
    if not f.is_file():
        return
    try:
        recorded = json.loads(f.read_text())
    except (OSError, ValueError, RecursionError):
        recorded = None
    check_base(Path(adapter_dir), recorded, base_identity(model_path, hf_dir), key)
