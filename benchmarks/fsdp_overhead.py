"""The sharded update's cost: one process vs 2 gloo ranks with FSDP2 on CPU (issue #21).

Both modes run the same actor work on the same synthetic global batch (GRPO groups of n rows
sharing a prompt): old and reference log-probs (KL loss on), one PPO update, and for 2 ranks
the gather into rank 0's rollout copy (the source of the weight push). Per mode: the median
seconds of each phase over ``--steps`` repeats after one warm-up. For 2 ranks the communication
share comes from the profiler: time inside collectives (all-gather, reduce-scatter, all-reduce,
broadcast) on rank 0, over the update's wall time. On a 2-core machine two ranks share the cores
one process had, so expect no speed-up: the point is the overhead.

Run by hand (SmolLM2: minutes on a 2-core CPU):
    python benchmarks/fsdp_overhead.py [--steps 3] [--groups 4] [--n 4] [--lora 0] [--tiny]
``--tiny`` swaps SmolLM2 for a tiny random model (a smoke test in seconds). Writes
benchmarks/results/fsdp_overhead.json (or ``--results DIR``) and prints one table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-agent"  # configs/grpo_smollm2_rlla.yaml's model
COMM = ("all_gather", "allgather", "reduce_scatter", "allreduce", "all_reduce", "broadcast")


def make_config(model: str, groups: int, n: int, resp: int, lora: int) -> Any:
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig

    ov = [
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.dtype=float32",
        f"actor_rollout_ref.model.lora_rank={lora}",
        f"data.train_batch_size={groups}",
        f"data.max_response_length={resp}",
        f"actor_rollout_ref.rollout.n={n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={groups}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "trainer.device=cpu",
    ]
    return load_config(TrainConfig, None, ov)


def make_batch(vocab: int, groups: int, n: int, prompt: int, resp: int) -> Any:
    from toolgrpo.trainer.batch import Batch

    g = torch.Generator().manual_seed(0)
    rows = groups * n
    prompts = torch.randint(10, vocab, (groups, prompt), generator=g).repeat_interleave(n, 0)
    ids = torch.cat([prompts, torch.randint(10, vocab, (rows, resp), generator=g)], 1)
    mask = torch.ones(rows, resp)
    lps = -torch.rand(rows, resp, generator=g) - 1
    b = Batch(ids, torch.ones_like(ids), mask, lps, uids=[f"g{i // n}" for i in range(rows)])
    b.old_logprobs_BR, b.ref_logprobs_BR = lps, lps - 0.05
    b.advantages_BR = torch.randn(rows, 1, generator=g) * mask
    return b


def run(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    """One mode (world 1: the plain actor; world 2: FSDP2 over gloo); rank 0 writes timings."""
    from toolgrpo.distributed.fsdp import Ranks
    from toolgrpo.models.loading import load_policy
    from toolgrpo.trainer.actor import Actor
    from toolgrpo.trainer.parallel import actor_policy, refresh_rollout_copy

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if world > 1:
        import torch.distributed as dist

        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
        )
        dist.init_process_group("gloo")
    cfg = make_config(args.model, args.groups, args.n, args.response, args.lora)
    torch.manual_seed(0)
    policy = load_policy(cfg.actor_rollout_ref.model)
    ranks = Ranks(rank, world, world > 1, torch.device("cpu"))
    actor = Actor(actor_policy(policy, ranks), cfg, 100, ranks)
    vocab = min(policy.base.config.vocab_size, 10_000)
    batch = make_batch(vocab, args.groups, args.n, args.prompt, args.response)
    phases: dict[str, list[float]] = {"logprob_s": [], "update_s": [], "gather_s": []}
    comm: list[float] = []
    for i in range(args.steps + 1):
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        with prof if world > 1 and i > 0 else _Null():
            t0 = time.perf_counter()
            actor.compute_logprobs(batch)
            actor.compute_logprobs(batch, reference=True)
            t1 = time.perf_counter()
            actor.update(batch)
            t2 = time.perf_counter()
            refresh_rollout_copy(actor, policy, ranks)
            t3 = time.perf_counter()
        if i == 0:
            continue  # warm-up
        phases["logprob_s"].append(t1 - t0)
        phases["update_s"].append(t2 - t1)
        phases["gather_s"].append(t3 - t2)
        if world > 1:
            comm.append(_comm_seconds(prof))
    if rank == 0:
        med = {k: statistics.median(v) for k, v in phases.items()}
        total = sum(med.values())
        rec: dict[str, Any] = {"world": world, "median": med, "total_s": total}
        if comm:
            rec["comm_s"] = statistics.median(comm)
            rec["comm_share"] = rec["comm_s"] / total
        Path(out).write_text(json.dumps(rec))
    if world > 1:
        torch.distributed.destroy_process_group()


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


def _comm_seconds(prof: Any) -> float:
    """Self CPU time of collective ops (the c10d ops and their waits), summed."""
    total_us = 0.0
    for ev in prof.key_averages():
        name = ev.key.lower()
        if any(c in name for c in COMM) or "c10d" in name:
            total_us += ev.self_cpu_time_total
    return total_us / 1e6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--response", type=int, default=96)
    ap.add_argument("--lora", type=int, default=0, help="LoRA rank (0 = full fine-tuning)")
    ap.add_argument("--tiny", action="store_true", help="a tiny random model (smoke test)")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="fsdp_overhead_"))
    args.model = MODEL
    if args.tiny:
        from toolgrpo.models.tiny import build_tiny_model_dir

        args.model = str(build_tiny_model_dir(work / "tiny"))
    modes = {}
    for world in (1, 2):
        out = str(work / f"world{world}.json")
        mp.spawn(run, args=(world, _free_port(), args, out), nprocs=world, join=True)
        modes[f"{world}_rank"] = json.loads(Path(out).read_text())
    base = modes["1_rank"]["total_s"]
    for m in modes.values():
        m["ratio_vs_1_rank"] = m["total_s"] / base
    record = {
        "model": args.model if not args.tiny else "tiny",
        "args": {k: v for k, v in vars(args).items() if k not in ("results", "model")},
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or "?"},
        "torch": torch.__version__,
        "modes": modes,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / ("fsdp_overhead_tiny.json" if args.tiny else "fsdp_overhead.json")
    path.write_text(json.dumps(record, indent=1))
    from rich.console import Console
    from rich.table import Table

    table = Table(title="FSDP2 update: 1 process vs 2 gloo ranks (median seconds per step)")
    for c in ("mode", "log-probs", "update", "gather", "total", "× 1 rank", "comm share"):
        table.add_column(c)
    for name, m in modes.items():
        med = m["median"]
        share = f"{m['comm_share']:.0%}" if "comm_share" in m else "-"
        table.add_row(
            name,
            f"{med['logprob_s']:.2f}",
            f"{med['update_s']:.2f}",
            f"{med['gather_s']:.3f}",
            f"{m['total_s']:.2f}",
            f"{m['ratio_vs_1_rank']:.2f}",
            share,
        )
    Console().print(table)
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
