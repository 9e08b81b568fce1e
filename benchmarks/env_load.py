"""Environments under load: episodes per second and failure share by environment type and
concurrency, on a stub model (no generation cost), so what is measured is the environment.

Each episode resets its environment, makes one tool call (2 + 3), answers ``<answer>5</answer>``
and is scored, through the trainer's own episode loop (``play_tasks``). Each (environment,
concurrency) runs ``--rounds`` rounds of that many concurrent episodes, each round under a fresh
event loop as the trainer runs a step, after one untimed episode (imports; a run's startup check
also opens one environment per type). ``episodes_per_s`` and ``env_s_per_episode`` (the wall time
an episode spends inside its environment's calls: reset, step, reward, close) are the last
round's: the steady state, where a pooled server was started in an earlier round, as in the steps
of a run; ``cold_*`` the first round's. ``failure_frac`` counts every round.

Environments: ``in_process`` (the calculator), ``served`` (the calculator behind ``toolgrpo
serve-env``), ``mcp_stdio`` and ``mcp_http`` (tests/envs/mcp_server.py), ``openenv``
(tests/envs/openenv_server.py with OpenEnv's default session limit, 1), and ``mcp_stdio_cap32``
(``mcp_stdio`` with ``max_concurrency: 32``: more episodes than that wait for a server).

Run by hand:  python benchmarks/env_load.py [--concurrency 8 32 128] [--envs ...]
              [--label after] [--note "..."]
Writes (merges its rows into) benchmarks/results/env_load.json and prints one table. Run it with
``PYTHONPATH=<old checkout>/src --label before`` to measure another version of the library.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import toolgrpo
from toolgrpo.data.task import Task
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.models.tiny import build_tiny_tokenizer
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.generator import Completion, SamplingParams
from toolgrpo.rollout.multi_turn import EpisodeLimits, play_tasks

REPO = Path(__file__).resolve().parents[1]
MCP_SERVER = REPO / "tests" / "envs" / "mcp_server.py"
OPENENV_SERVER = REPO / "tests" / "envs" / "openenv_server.py"
OUT = REPO / "benchmarks" / "results" / "env_load.json"
ENVS = ("in_process", "served", "mcp_stdio", "mcp_http", "openenv", "mcp_stdio_cap32")
ADD = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
CALC = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+3"}}\n</tool_call>'


@dataclass
class StubModel:
    """One scripted tool call, then the answer; no model runs."""

    tokenizer: Any
    call: str

    @property
    def eos_ids(self) -> list[int]:
        return [self.tokenizer.convert_tokens_to_ids("<|im_end|>")]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        out = []
        for i, p in enumerate(prompts):  # identical prompts come once, with n = their number
            turn = self.tokenizer.decode(p).count("<|im_start|>assistant") - 1
            text = self.call if turn == 0 else "<answer>5</answer>"
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + self.eos_ids
            out += [Completion(i, list(p), ids, [0.0] * len(ids), "stop")] * params.n
        return out


class TimedRouter(EnvRouter):
    """The router, with each environment's time inside its calls added up (``env_s``)."""

    env_s: list[float]

    def make(self, task: Task) -> Any:
        env = super().make(task)
        for name in ("reset", "step", "reward", "close"):
            setattr(env, name, self._timed(getattr(env, name)))
        return env

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        async def call(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await fn(*args)
            finally:
                self.env_s.append(time.perf_counter() - t0)

        return call


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def process(cmd: list[str], port: int) -> Iterator[None]:
    """A server subprocess, until its port accepts connections."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start: {cmd}")
            time.sleep(0.2)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def environment(name: str) -> Iterator[tuple[dict[str, Any], str]]:
    """The environment's config entry and the call the stub model makes, its server running."""
    py = sys.executable
    if name == "in_process":
        yield {"type": "calculator"}, CALC
    elif name == "served":
        port = free_port()
        cmd = [py, "-m", "toolgrpo.cli", "serve-env", "calculator", "--port", str(port)]
        with process(cmd, port):
            yield {"type": "remote", "url": f"ws://127.0.0.1:{port}/ws"}, CALC
    elif name == "mcp_stdio":
        yield {"type": "mcp", "command": [py, str(MCP_SERVER)]}, ADD
    elif name == "mcp_stdio_cap32":  # at most 32 servers: more episodes wait for one
        yield {"type": "mcp", "command": [py, str(MCP_SERVER)], "max_concurrency": 32}, ADD
    elif name == "mcp_http":
        port = free_port()
        with process([py, str(MCP_SERVER), str(port)], port):
            yield {"type": "mcp", "url": f"http://127.0.0.1:{port}/mcp"}, ADD
    elif name == "openenv":
        port = free_port()
        with process([py, str(OPENENV_SERVER), str(port)], port):  # default session limit: 1
            yield {"type": "openenv", "url": f"http://127.0.0.1:{port}"}, ADD
    else:
        raise ValueError(f"unknown environment {name!r}; known: {ENVS}")


def play_round(router: TimedRouter, model: StubModel, n: int, seed: int) -> tuple[float, list[str]]:
    """``n`` concurrent episodes: (seconds, the environment failures' reasons)."""
    tasks = [
        Task(f"e{seed}_{i}", ({"role": "user", "content": "What is 2+3?"},), "5", "b", "load")
        for i in range(n)
    ]
    batcher = GenerationBatcher(model, SamplingParams(max_new_tokens=64), max_batch=n)
    limits = EpisodeLimits(max_prompt_length=8192, max_response_length=1024)
    t0 = time.perf_counter()
    try:
        eps = asyncio.run(play_tasks(tasks, 1, router, batcher, model.tokenizer, limits))
    finally:
        batcher.close()
    seconds = time.perf_counter() - t0
    return seconds, [e.env_failure for e in eps if e.env_failure is not None]


def close_pools() -> None:
    """Stop pooled servers, so each environment starts from none."""
    try:
        from toolgrpo.envs.pool import close_env_pools
    except ImportError:  # a library without the pool
        return
    close_env_pools()


def measure(name: str, levels: list[int], rounds: int, tok: Any) -> list[dict[str, Any]]:
    close_pools()
    rows = []
    with environment(name) as (entry, call):
        model = StubModel(tok, call)
        warm = TimedRouter({"load": {**entry, "max_turns": 3}})
        warm.env_s = []
        play_round(warm, model, 1, -1)  # imports, a server's first start: as at a run's startup
        for c in levels:
            router = TimedRouter({"load": {**entry, "max_turns": 3}})
            runs, env_s = [], []
            for r in range(rounds):
                router.env_s = []
                runs.append(play_round(router, model, c, r))
                env_s.append(sum(router.env_s) / c)
            failures = [f for _, fs in runs for f in fs]
            reasons = Counter(f[:80] for f in failures).most_common(3)
            rows.append(
                {
                    "env": name,
                    "concurrency": c,
                    "episodes_per_s": round(c / runs[-1][0], 2),
                    "failure_frac": round(len(failures) / (c * rounds), 4),
                    "env_s_per_episode": round(env_s[-1], 4),
                    "cold_episodes_per_s": round(c / runs[0][0], 2),
                    "cold_env_s_per_episode": round(env_s[0], 4),
                    "rounds": rounds,
                    "failure_reasons": [f"{n}x {r}" for r, n in reasons],
                    "failures_per_round": [len(fs) for _, fs in runs],
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    close_pools()
    return rows


def kept(record: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The label's earlier rows this run does not measure again."""
    old = record.get("runs", {}).get(args.label, {}).get("rows", [])
    return [r for r in old if r["env"] not in args.envs or r["concurrency"] not in args.concurrency]


def summarize(runs: dict[str, Any]) -> dict[str, Any]:
    """``results``: the ``after`` run's rows (env, concurrency, episodes_per_s, failure_frac);
    ``env_cost_ratio``: per environment and concurrency where neither run had a failure, the
    ``before`` run's environment time per episode over the ``after`` run's (how many times
    cheaper an episode's environment got)."""
    after = runs.get("after", {}).get("rows", [])
    before = {(r["env"], r["concurrency"]): r for r in runs.get("before", {}).get("rows", [])}
    ratios = {}
    for r in after:
        old = before.get((r["env"], r["concurrency"]))
        failed = old is None or old.get("failure_frac", 0) > 0 or r["failure_frac"] > 0
        if not failed and r["env_s_per_episode"] > 0:  # a refused episode costs nothing
            key = f"{r['env']}@{r['concurrency']}"
            ratios[key] = round(old["env_s_per_episode"] / r["env_s_per_episode"], 1)
    return {"results": after, "env_cost_ratio": ratios}


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", nargs="+", default=list(ENVS), choices=ENVS)
    ap.add_argument("--concurrency", nargs="+", type=int, default=[8, 32, 128])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--label", default="after", help="which version of the library this is")
    ap.add_argument("--note", default="", help="conditions (another job on the cores, say)")
    args = ap.parse_args(argv)
    tok = build_tiny_tokenizer()
    rows = []
    for name in args.envs:
        rows += measure(name, sorted(args.concurrency), args.rounds, tok)
    table = Table(title=f"environments under load ({args.label}; stub model)")
    for col in ("env", "concurrency", "episodes/s", "failure", "cold eps/s", "env s/episode"):
        table.add_column(col, justify="left" if col == "env" else "right")
    for r in rows:
        table.add_row(
            r["env"],
            str(r["concurrency"]),
            f"{r['episodes_per_s']:.2f}",
            f"{r['failure_frac']:.3f}",
            f"{r['cold_episodes_per_s']:.2f}",
            f"{r['env_s_per_episode']:.3f}",
        )
    Console().print(table)
    record = json.loads(OUT.read_text()) if OUT.exists() else {}
    record.setdefault("runs", {})[args.label] = {
        "library": str(Path(toolgrpo.__file__).parent),
        "note": args.note,
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": kept(record, args) + rows,
    }
    record.update(summarize(record["runs"]))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main(sys.argv[1:])
