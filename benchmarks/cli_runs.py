"""Running the toolgrpo CLI from a benchmark script: the same interpreter, from the repository
root, its output appended to a log; a failure stops the benchmark naming the log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def toolgrpo(*args: str, log: Path) -> None:
    """``toolgrpo <args>``, output appended to ``log``; stop on failure."""
    cmd = [sys.executable, "-m", "toolgrpo.cli", *args]
    print("$", " ".join(cmd), flush=True)
    with log.open("a") as fh:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise SystemExit(f"failed (rc {rc}): {' '.join(args)}; see {log}")
