"""Episode throughput of the multi-turn loop: concurrent episodes hide tool latency.

Each episode makes ``--turns`` tool-call turns (every call sleeps ``--latency`` seconds) and then
answers. Generation is real: a randomly initialised Llama (hidden 256, 4 layers) samples
``--tokens`` tokens per turn through the HF backend, batched across episodes; its sampled text is
then replaced by the scripted tool call, so every run does the same work.

Run by hand:  python benchmarks/rollout_concurrency.py [--episodes 32] [--latency 0.05]
Writes benchmarks/results/rollout_concurrency.json and prints one table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from toolgrpo.data.task import Task  # noqa: E402
from toolgrpo.envs.base import Env, EnvReward, EnvStart  # noqa: E402
from toolgrpo.envs.registry import EnvRouter, register_env  # noqa: E402
from toolgrpo.models.tiny import build_tiny_model_dir  # noqa: E402
from toolgrpo.rollout.batcher import GenerationBatcher  # noqa: E402
from toolgrpo.rollout.generator import Completion, SamplingParams  # noqa: E402
from toolgrpo.rollout.hf import HFGenerator  # noqa: E402
from toolgrpo.rollout.multi_turn import EpisodeLimits, play_tasks  # noqa: E402
from toolgrpo.tools.types import ToolResult  # noqa: E402

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "k"}}\n</tool_call>'


@dataclass
class ScriptedCost:
    """Real batched generation for the cost; scripted text so every episode makes its calls."""

    inner: HFGenerator
    tokenizer: object
    turns: int

    @property
    def eos_ids(self) -> list[int]:
        return self.inner.eos_ids

    def generate(self, prompts, params):
        comps = self.inner.generate(prompts, params)
        out = []
        for c in comps:
            done = self.tokenizer.decode(c.prompt_ids).count("<|im_start|>assistant") - 1
            text = CALL if done < self.turns else "<answer>ok</answer>"
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + self.eos_ids[:1]
            out.append(Completion(c.prompt_index, c.prompt_ids, ids, [0.0] * len(ids), "stop"))
        return out


class SleepEnv(Env):
    latency = 0.0

    def __init__(self, task: Task, options) -> None:
        self.task, self.max_turns = task, 100

    async def reset(self) -> EnvStart:
        return EnvStart([dict(m) for m in self.task.messages], [])

    async def step(self, calls):
        await asyncio.sleep(SleepEnv.latency)
        return [ToolResult("value-of-k", name=c.name, call_id=c.id) for c in calls]

    async def reward(self, transcript) -> EnvReward:
        return EnvReward(1.0)


register_env("bench_sleep")(SleepEnv)


def run(gen, tok, tasks, latency: float, concurrent: int, max_batch: int, tokens: int) -> float:
    SleepEnv.latency = latency
    params = SamplingParams(max_new_tokens=tokens)
    batcher = GenerationBatcher(gen, params, max_batch)
    router = EnvRouter({"bench": {"type": "bench_sleep", "max_turns": 100}})
    limits = EpisodeLimits(max_prompt_length=4096, max_response_length=4096, max_tokens_per_turn=64)
    t0 = time.perf_counter()
    eps = asyncio.run(play_tasks(tasks, 1, router, batcher, tok, limits, max_concurrent=concurrent))
    seconds = time.perf_counter() - t0
    batcher.close()
    assert all(e.stop_reason == "answer" for e in eps), {e.stop_reason for e in eps}
    return len(eps) / seconds


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--tokens", type=int, default=24, help="tokens generated per turn")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    d = build_tiny_model_dir(Path(tempfile.mkdtemp()) / "m", hidden_size=256, num_layers=4)
    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    gen = ScriptedCost(HFGenerator(model, tok, torch.float32, args.max_batch), tok, args.turns)
    gen.inner.eos_ids = []  # the random model must not stop early: fixed work per turn
    tasks = [
        Task(f"b{i}", ({"role": "user", "content": f"look up k for item {i}"},), "", "b", "bench")
        for i in range(args.episodes)
    ]
    cases = {
        "concurrent, no tool latency": (0.0, 0, args.max_batch),
        f"concurrent, tools sleep {args.latency * 1000:.0f} ms": (args.latency, 0, args.max_batch),
        f"sequential, tools sleep {args.latency * 1000:.0f} ms": (args.latency, 1, 1),
    }
    run(gen, tok, tasks[:4], 0.0, 0, args.max_batch, args.tokens)  # warm-up
    results = {}
    for name, (lat, conc, mb) in cases.items():
        rates = [run(gen, tok, tasks, lat, conc, mb, args.tokens) for _ in range(args.repeats)]
        results[name] = {"episodes_per_s": max(rates), "all": rates}
    names = list(cases)
    base, hidden, seq = (results[n]["episodes_per_s"] for n in names)
    summary = {
        "latency_hidden_ratio": hidden / base,  # goal >= 0.9
        "concurrent_over_sequential": hidden / seq,  # goal: several times
    }
    table = Table(title="multi-turn episode throughput (episodes/s, best of repeats)")
    table.add_column("case")
    table.add_column("episodes/s", justify="right")
    for n in names:
        table.add_row(n, f"{results[n]['episodes_per_s']:.2f}")
    Console().print(table)
    print(json.dumps(summary, indent=1))
    record = {
        "config": vars(args),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "torch_threads": torch.get_num_threads(),
        "results": results,
        **summary,
    }
    out = Path(__file__).parent / "results" / "rollout_concurrency.json"
    out.write_text(json.dumps(record, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
