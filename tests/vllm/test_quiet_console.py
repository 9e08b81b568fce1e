"""The main job's path: ``toolgrpo train`` sampling with vLLM (the engine's own dtype, bf16 where
the CPU has it, so weight pushes are cast) keeps the console to toolgrpo's lines; vLLM's start-up
logging goes to <output_dir>/run.log. Its own engine, in a subprocess."""

from __future__ import annotations

import subprocess
import sys

from tests.test_run_log import check_quiet_run, quiet_train_env
from tests.vllm.conftest import vllm_train_overrides


def test_vllm_train_console_is_quiet(vllm_ready, tiny_data, tmp_path):
    out = tmp_path / "run"
    extra = {
        "actor_rollout_ref.rollout.dtype": "auto",
        "trainer.logger": "[console,jsonl]",
        "trainer.total_training_steps": "1",
    }
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolgrpo.cli",
            "train",
            *vllm_train_overrides(tiny_data, out, **extra),
        ],
        capture_output=True,
        text=True,
        env=quiet_train_env(),
        timeout=900,
    )
    check_quiet_run(p, out)
    log = (out / "run.log").read_text()
    assert "vllm" in log and "Attempted to load weight" not in log
