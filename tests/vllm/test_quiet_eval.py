"""``toolgrpo eval`` on the vLLM backend keeps a quiet console, as ``train`` does: the table and
toolgrpo's lines, at most 25 lines in all; vLLM's start-up (seed, chunked prefill, Triton,
deprecations, ``set_num_threads``...) goes to ``run.log`` beside the JSON, and neither torch's C++
warnings nor tqdm bars (the GGUF conversion's 29 lines) reach the console. It used to print 16
vLLM warning lines around its table. Its own engine, in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.test_run_log import quiet_train_env
from tests.vllm.conftest import ENGINE_OVERRIDES

ROOT = Path(__file__).resolve().parents[2]


def test_vllm_eval_console_is_at_most_25_lines(vllm_ready, tmp_path):
    out = tmp_path / "eval" / "eval.json"
    over = {
        **ENGINE_OVERRIDES,
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.dtype": "auto",  # the main job's engine dtype
        "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn": "32",
        "data.max_response_length": "128",
    }
    cmd = [sys.executable, "-m", "toolgrpo.cli", "eval", "--limit", "3", "--samples", "0"]
    cmd += ["--output", str(out), str(ROOT / "configs" / "agent_smollm2_grpo.yaml")]
    cmd += [f"{k}={v}" for k, v in over.items()]
    # A fresh model cache: the GGUF conversion (and its tqdm bar) runs as on a first use.
    env = {**quiet_train_env(), "TOOLGRPO_CACHE": str(tmp_path / "cache")}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [s for s in (p.stdout + p.stderr).splitlines() if s.strip()]
    assert len(lines) <= 25, "\n".join(lines)
    assert json.loads(out.read_text())["backend"].startswith("vllm")
    # stdout ends with the result's path (stderr, read apart, holds the progress lines)
    assert p.stdout.strip().splitlines()[-1].startswith(f"wrote {out}")
    log = (out.parent / "run.log").read_text()
    assert "vllm" in log
