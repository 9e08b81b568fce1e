"""Running the toolgrpo CLI from a benchmark script: the same interpreter, from the repository
root, its output appended to a log; a failure stops the benchmark naming the log."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The main job samples dynamically; a benchmark whose runs were made one batch a step, or whose
# system refuses dynamic sampling (the mixture), trains with this override.
ONE_BATCH = "algorithm.filter_groups.enable=false"
# The main job's three environment types without its generated-tool tasks: a benchmark measured
# on them (the mixture's, whose fixed policies play only the environments) names them.
IN_HOUSE = "data.train_files=[calculator:train,search:train,direct:train]"


def toolgrpo(*args: str, log: Path) -> None:
    """``toolgrpo <args>``, output appended to ``log``; stop on failure."""
    cmd = [sys.executable, "-m", "toolgrpo.cli", *args]
    print("$", " ".join(cmd), flush=True)
    with log.open("a") as fh:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise SystemExit(f"failed (rc {rc}): {' '.join(args)}; see {log}")


def run_timed(cmd: list[str], log: Path) -> float:
    """Run one command, its output to ``log`` (overwritten); its wall time. A failure stops the
    benchmark with the log's last 20 lines."""
    t0 = time.time()
    with log.open("w") as fh:
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise SystemExit(f"{' '.join(cmd)} failed (exit {rc}):\n{tail}")
    return time.time() - t0


def cpu_flags() -> list[str]:
    """The CPU features that decide torch's speed here (AVX2 vs AVX512 / native bf16 / AMX)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    words = set(line.split(":", 1)[-1].split())
    return [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in words]


def machine() -> dict:
    """The machine a benchmark's numbers were made on: CPU flags, the compute dtype
    ``dtype: auto`` picks here, cores and torch."""
    import os

    import torch

    from toolgrpo.models.loading import compute_dtype

    return {
        "cpu_flags": cpu_flags(),
        "dtype": str(compute_dtype("auto", torch.device("cpu"))).replace("torch.", ""),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
    }
