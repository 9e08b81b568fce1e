"""Multi-turn rollouts on vLLM: waves (``rollout.mode=sync``: the in-process engine behind
``GenerationBatcher``, one ``generate`` per wave of turns) vs the async engine (``mode=async``:
each turn its own request, continuously batched).

Every episode plays ``--turns`` assistant turns: after each one the environment waits a seeded
random "tool" latency (0 to ``--latency`` s) and replies with a follow-up user turn, whatever the
model wrote. Sampling is real (SmolLM2-135M, the shipped warm start merged, T=1), so turn lengths
vary the way they do in training; in a wave the shortest turns wait for the longest. Both modes
run the same episodes from the same torch seed (the samples differ: requests draw their seeds in
another order); engine start-up is excluded and reported apart.

Run by hand (minutes on a 2-core CPU; needs the vLLM venv, see README):
    python benchmarks/multi_turn_vllm.py [--tasks 8] [--n 4] [--turns 3] [--tokens 48]
        [--latency 0.2] [--repeats 2]
Smoke test: --tasks 1 --n 2 --turns 2 --tokens 4 --repeats 1
Writes benchmarks/results/multi_turn_vllm.json and prints one table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from toolgrpo.config.loader import load_config  # noqa: E402
from toolgrpo.config.schema import TrainConfig  # noqa: E402
from toolgrpo.data.task import Task  # noqa: E402
from toolgrpo.envs.base import Env, EnvReward, EnvStart  # noqa: E402
from toolgrpo.envs.registry import EnvRouter, register_env  # noqa: E402
from toolgrpo.models.loading import load_policy  # noqa: E402
from toolgrpo.rollout.backends import make_generator  # noqa: E402
from toolgrpo.rollout.batcher import GenerationBatcher  # noqa: E402
from toolgrpo.rollout.generator import SamplingParams  # noqa: E402
from toolgrpo.rollout.multi_turn import EpisodeLimits, play_tasks  # noqa: E402
from toolgrpo.tools.types import ToolResult  # noqa: E402

TOPICS = ("volcanoes", "bread", "chess", "rivers", "comets", "bees", "glass", "tides", "maps")


class FollowUpEnv(Env):
    """Replies to every turn, after a seeded random delay, until ``turns`` turns are played."""

    turns = 3
    latency = 0.2

    def __init__(self, task: Task, options: Any) -> None:
        self.task = task
        self.max_turns = FollowUpEnv.turns
        self.rng = random.Random(task.task_id)
        self.replies = 0

    async def reset(self) -> EnvStart:
        return EnvStart([dict(m) for m in self.task.messages], [])

    async def _wait(self) -> None:
        await asyncio.sleep(self.rng.uniform(0, FollowUpEnv.latency))

    async def step(self, calls: Any) -> list[ToolResult]:  # if the model writes a tool call
        await self._wait()
        return [ToolResult("noted", name=c.name, call_id=c.id) for c in calls]

    async def next_user_turn(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        self.replies += 1
        if self.replies >= FollowUpEnv.turns:
            return None
        await self._wait()
        return [{"role": "user", "content": "Tell me one more fact about it."}]

    async def reward(self, transcript: Any) -> EnvReward:
        return EnvReward(0.0)


register_env("bench_follow_up")(FollowUpEnv)


def run(gen: Any, tok: Any, tasks: list[Task], args: argparse.Namespace, seed: int) -> dict:
    torch.manual_seed(seed)
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=args.tokens), 64)
    router = EnvRouter({"bench": {"type": "bench_follow_up", "max_turns": args.turns}})
    limits = EpisodeLimits(
        max_prompt_length=512, max_response_length=1024, max_tokens_per_turn=args.tokens
    )
    t0 = time.perf_counter()
    try:
        eps = asyncio.run(play_tasks(tasks, args.n, router, batcher, tok, limits))
    finally:
        batcher.close()
    wall = time.perf_counter() - t0
    sampled = sum(sum(e.response_mask) for e in eps)
    bad = [e.stop_reason for e in eps if e.stop_reason == "env_error"]
    if bad:
        raise RuntimeError(f"{len(bad)} episodes failed")
    return {
        "wall_s": wall,
        "episodes_per_s": len(eps) / wall,
        "sampled_tokens": sampled,
        "sampled_tok_per_s": sampled / wall,
        "turns": sum(e.num_turns for e in eps),
        "backend_calls": batcher.calls,
        "requests_per_call": batcher.requests / max(1, batcher.calls),
    }


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--n", type=int, default=4, help="episodes per task")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48, help="max tokens per turn")
    ap.add_argument("--latency", type=float, default=0.2, help="max tool/user delay, s")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model", default="smollm2-135m-toolrl")
    args = ap.parse_args(argv)
    FollowUpEnv.turns, FollowUpEnv.latency = args.turns, args.latency
    topics = (TOPICS * (args.tasks // len(TOPICS) + 1))[: args.tasks]
    asks = [{"role": "user", "content": f"Tell me a fact about {t}."} for t in topics]
    tasks = [Task(f"t{i}", (m,), "", "b", "bench") for i, m in enumerate(asks)]
    overrides = {
        "actor_rollout_ref.model.path": args.model,
        "actor_rollout_ref.model.dtype": "float32",
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.dtype": "float32",
        "actor_rollout_ref.rollout.max_model_len": "1536",
        "actor_rollout_ref.rollout.max_num_seqs": "64",
        "actor_rollout_ref.rollout.cpu_kvcache_space_gb": "2",
    }
    policy = None
    results: dict[str, dict] = {}
    for mode in ("sync", "async"):
        cfg = load_config(
            TrainConfig,
            None,
            [f"{k}={v}" for k, v in {**overrides, "actor_rollout_ref.rollout.mode": mode}.items()],
        )
        if policy is None:
            policy = load_policy(cfg.actor_rollout_ref.model, trainable=False)
        t0 = time.perf_counter()
        gen = make_generator(cfg, policy)
        start = time.perf_counter() - t0
        try:
            run(gen, policy.tokenizer, tasks[:1], args, seed=123)  # warm-up
            runs = [run(gen, policy.tokenizer, tasks, args, seed=s) for s in range(args.repeats)]
        finally:
            gen.close()
        results[mode] = {
            "engine_start_s": start,
            "weight_sync_s": gen.last_sync_s,
            "runs": runs,
            "median_wall_s": statistics.median(r["wall_s"] for r in runs),
            "median_episodes_per_s": statistics.median(r["episodes_per_s"] for r in runs),
            "median_sampled_tok_per_s": statistics.median(r["sampled_tok_per_s"] for r in runs),
        }
    speedup = results["sync"]["median_wall_s"] / results["async"]["median_wall_s"]
    table = Table(title=f"{args.tasks}x{args.n} episodes, {args.turns} turns, <= {args.tokens} tok")
    for col in ("mode", "wall s", "episodes/s", "sampled tok/s", "requests/call", "start s"):
        table.add_column(col, justify="right")
    for mode, r in results.items():
        table.add_row(
            mode,
            f"{r['median_wall_s']:.1f}",
            f"{r['median_episodes_per_s']:.2f}",
            f"{r['median_sampled_tok_per_s']:.1f}",
            f"{statistics.median(x['requests_per_call'] for x in r['runs']):.1f}",
            f"{r['engine_start_s']:.1f}",
        )
    Console().print(table)
    print(f"async over sync (wall): {speedup:.2f}x")
    record = {
        "config": vars(args),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
        "results": results,
        "async_over_sync_wall": speedup,
    }
    out = Path(__file__).parent / "results" / "multi_turn_vllm.json"
    out.write_text(json.dumps(record, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
