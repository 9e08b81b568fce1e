"""scripts/gpu_smoke.sh in its CPU dry mode: the same checks a GPU machine runs (2 steps, 2 FSDP2
steps on one gloo rank, the four systems on one rank and on 2 ranks that each sample their share,
eval), so the script is exercised on every CI run and cannot rot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _smoke(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = ["bash", "scripts/gpu_smoke.sh", "--python", sys.executable, "--out", str(tmp_path)]
    return subprocess.run(
        [*cmd, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def test_dry_mode_passes_every_check(tmp_path):
    r = _smoke(tmp_path / "smoke", "--device", "cpu")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    expected = [
        "ok   env ",
        "ok   train-2-steps cpu ",
        "info rollout-metrics cpu ",
        "ok   fsdp2-2-steps cpu ",
        "ok   all-systems-2-steps cpu ",
        "ok   fsdp2-2-ranks cpu ",
        "ok   eval fsdp2 global_step_2 cpu",
    ]
    assert [x[: len(e)] for x, e in zip(lines, expected, strict=True)] == expected, r.stdout
    assert "backend=gloo" in lines[3] and "max_weight_change=" in lines[1]
    assert "router/lambda=" in lines[4] and "rollout/negative_samples=" in lines[4]
    assert "rollout/sampling_ranks=2" in lines[5] and "backend=gloo" in lines[5]
    assert "num_tasks=8" in lines[6]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the failure needs a machine without CUDA")
def test_cuda_without_a_gpu_fails_at_the_first_check(tmp_path):
    r = _smoke(tmp_path / "smoke", "--device", "cuda")
    assert r.returncode == 1
    assert r.stdout.startswith("FAIL env "), r.stdout
    assert "sees no CUDA device" in r.stdout
    assert "train-2-steps" not in r.stdout  # nothing runs after the first failure
