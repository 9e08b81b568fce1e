"""Loading ``.pt`` files without running code: a pickle may name any Python callable, so
checkpoint files are read with torch's weights-only unpickler (tensors and plain containers)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message is one line for the user."""


class CorruptCheckpoint(CheckpointError):
    """Missing, truncated or unparsable files: resume may fall back to an older checkpoint."""


class UnsafeCheckpoint(CheckpointError):
    """A file holding Python objects beyond tensors and plain containers: never loaded."""


def load_torch_file(path: str | Path) -> Any:
    """``torch.load(weights_only=True)`` with one-line errors that say why a file was refused."""
    path = Path(path)
    if not path.is_file():
        raise CorruptCheckpoint(f"{path} is missing")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "global" not in str(e).lower():
            raise CorruptCheckpoint(f"{path} is unreadable (a torn or corrupt pickle)") from None
        raise UnsafeCheckpoint(
            f"{path} refused: it holds Python objects, not only tensors and plain containers, "
            "and loading it could run code (a crafted file, or not written by toolgrpo); "
            "delete it or start a new trainer.output_dir"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CorruptCheckpoint(f"{path} is unreadable ({reason})") from None
