"""The sharded update's cost: one process vs 2 gloo ranks with FSDP2 on CPU (issue #21).

Both modes run the same actor work on the same synthetic global batch (GRPO groups of n rows
sharing a prompt): old log-probs, reference log-probs (with the KL loss on), one PPO update,
and for 2 ranks the gather into rank 0's rollout copy (the source of the weight push). Per
mode: the median seconds of each phase over ``--steps`` unprofiled repeats after one warm-up,
and each rank's peak RSS. For 2 ranks one extra repeat runs under the torch CPU profiler: its
time inside collectives (all-gather, reduce-scatter, all-reduce, broadcast) on rank 0 over that
repeat's wall time is the communication share. Only rank 0 parses the profiler's events, which
are dropped right after, and glibc is told beforehand to mmap big blocks (``bound_heap``): a
profiler per repeat, parsed on every rank, is the likeliest reason two SmolLM2 ranks went past
24 GiB (extrapolated from narrow random models). On a 2-core machine two ranks share the cores
one process had, so expect no speed-up: the point is the overhead. Peak RSS is what the OS saw:
under FSDP2 glibc's heap keeps the freed all-gather buffers, so a rank's peak is well above its
live tensors.

The model is SmolLM2-135M's base (``smollm2-135m``) with a fresh LoRA of rank ``--lora``
(default 16, the rank and target modules of the shipped agent adapter the main job trains), so
the reference is the actor with its adapter off; ``--lora 0`` is full fine-tuning, where the
reference is a second (sharded) copy and AdamW keeps two fp32 moments per weight.

Run by hand (SmolLM2: about 10 min on a quiet 2-core CPU, estimated):
    python benchmarks/fsdp_overhead.py [--steps 3] [--groups 4] [--n 4] [--lora 16] [--tiny]
``--tiny`` swaps SmolLM2 for a tiny random model (a smoke test in seconds). Writes
benchmarks/results/fsdp_overhead.json (or ``--results DIR``) and prints one table.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import resource
import socket
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m"  # the base of configs/grpo_smollm2_rlla.yaml's model, without its adapter
COMM = ("all_gather", "allgather", "reduce_scatter", "allreduce", "all_reduce", "broadcast")
GIB = 2**30


def make_config(model: str, args: argparse.Namespace) -> Any:
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig

    ov = [
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.dtype=float32",
        f"actor_rollout_ref.model.lora_rank={args.lora}",
        f"data.train_batch_size={args.groups}",
        f"data.max_response_length={args.response}",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.groups}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        f"actor_rollout_ref.actor.use_kl_loss={str(args.kl).lower()}",
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


def rss_gib() -> float:
    """This process's resident set now (Linux ``/proc``; the peak where that is missing)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / GIB
    except (OSError, ValueError, IndexError):
        return peak_rss_gib()


def peak_rss_gib() -> float:
    """This process's peak resident set (``ru_maxrss``: KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def bound_heap() -> None:
    """glibc mmaps every block over 128 KiB from now on (a big free no longer raises that bound)
    and returns free heap pages. Done before the profiled repeat only: otherwise its millions of
    small event records pin the heap holes big tensors left, and the heap grows per layer."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return
    libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
    libc.malloc_trim(0)


def run(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    """One mode (world 1: the plain actor; world 2: FSDP2 over gloo); rank 0 writes the record."""
    from toolgrpo.distributed.fsdp import Ranks
    from toolgrpo.models.loading import load_policy
    from toolgrpo.trainer.actor import Actor
    from toolgrpo.trainer.parallel import actor_policy, refresh_rollout_copy

    torch.set_num_threads(max(1, args.threads // world))
    if world > 1:
        import torch.distributed as dist

        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
        )
        dist.init_process_group("gloo")
    cfg = make_config(args.model, args)
    torch.manual_seed(0)
    policy = load_policy(cfg.actor_rollout_ref.model)
    params = sum(p.numel() for p in policy.model.parameters())
    trainable = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    ranks = Ranks(rank, world, world > 1, torch.device("cpu"))
    actor = Actor(actor_policy(policy, ranks), cfg, 100, ranks)
    reference = "none (KL off)"
    if actor.needs_ref:
        reference = "adapter off" if actor.ref is None else "a frozen copy, sharded in 2_rank"
    vocab = min(policy.base.config.vocab_size, 10_000)
    batch = make_batch(vocab, args.groups, args.n, args.prompt, args.response)
    mem: dict[str, Any] = {"rank": rank, "setup_gib": rss_gib(), "after_repeat_gib": []}
    phases: dict[str, list[float]] = {"logprob_s": [], "update_s": [], "gather_s": []}
    rec: dict[str, Any] = {"world": world}
    profiled_at = args.steps + 1 if world > 1 else None  # warm-up, steps, one profiled repeat
    for i in range(args.steps + 1 + (profiled_at is not None)):
        prof = None
        if i == profiled_at:
            mem["peak_unprofiled_gib"] = peak_rss_gib()
            bound_heap()
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        with prof if prof is not None else nullcontext():
            t0 = time.perf_counter()
            actor.compute_logprobs(batch)
            if args.kl:
                actor.compute_logprobs(batch, reference=True)
            t1 = time.perf_counter()
            actor.update(batch)
            t2 = time.perf_counter()
            refresh_rollout_copy(actor, policy, ranks)
            t3 = time.perf_counter()
        if prof is not None:
            # Every rank is profiled (the same overhead on both sides of each collective), but
            # only rank 0's events are parsed: about 4 KB an op, 2.4 GiB for the 575k ops of a
            # 30-layer LoRA repeat, held in reference cycles that only a collection frees.
            if rank == 0:
                rec["comm_s"] = _comm_seconds(prof)
                rec["profiled_total_s"] = t3 - t0
                rec["comm_share"] = rec["comm_s"] / (t3 - t0)
            del prof
            gc.collect()
        elif i > 0:  # not the warm-up
            for k, dt in zip(phases, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                phases[k].append(dt)
        mem["after_repeat_gib"].append(rss_gib())
    mem["peak_gib"] = peak_rss_gib()
    mem.setdefault("peak_unprofiled_gib", mem["peak_gib"])
    mems = [mem]
    if world > 1:
        mems = [{} for _ in range(world)]
        torch.distributed.all_gather_object(mems, mem)
    if rank == 0:
        med = {k: statistics.median(v) for k, v in phases.items()}
        rec.update(median=med, total_s=sum(med.values()), ranks=mems)
        rec["setting"] = {"params": params, "trainable": trainable, "reference": reference}
        Path(out).write_text(json.dumps(rec))
    if world > 1:
        torch.distributed.destroy_process_group()


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


def describe(record: dict[str, Any]) -> str:
    """The setting in one line (the table's caption)."""
    a, s = record["args"], record["setting"]
    lora = f"LoRA r{a['lora']}" if a["lora"] else "full fine-tuning"
    kl = f"KL loss on (reference: {s['reference']})" if a["kl"] else "KL loss off"
    return (
        f"{record['model']}, {lora} ({s['trainable'] / 1e6:.3g}M of {s['params'] / 1e6:.3g}M "
        f"params trained), {a['groups']} groups × n {a['n']}, prompt {a['prompt']}, "
        f"response {a['response']}, {kl}; torch threads: {max(1, a['threads'])} in 1 rank, "
        f"{max(1, a['threads'] // 2)} in each of 2"
    )


def print_table(record: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title="FSDP2 update: 1 process vs 2 gloo ranks (median seconds per step)",
        caption=describe(record),
    )
    cols = ("mode", "log-probs", "update", "gather", "total", "× 1 rank", "comm share")
    for c in (*cols, "peak RSS/rank, GiB", "with profiler"):
        table.add_column(c)
    for name, m in record["modes"].items():
        med = m["median"]
        share = f"{m['comm_share']:.0%}" if "comm_share" in m else "-"
        peaks = " + ".join(f"{r['peak_unprofiled_gib']:.2f}" for r in m["ranks"])
        prof = " + ".join(f"{r['peak_gib']:.2f}" for r in m["ranks"]) if "comm_s" in m else "-"
        table.add_row(
            name,
            f"{med['logprob_s']:.2f}",
            f"{med['update_s']:.2f}",
            f"{med['gather_s']:.3f}",
            f"{m['total_s']:.2f}",
            f"{m['ratio_vs_1_rank']:.2f}",
            share,
            peaks,
            prof,
        )
    Console(width=160).print(table)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="timed repeats after one warm-up")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--response", type=int, default=96)
    ap.add_argument("--lora", type=int, default=16, help="LoRA rank (0 = full fine-tuning)")
    ap.add_argument("--kl", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="split over ranks")
    ap.add_argument("--tiny", action="store_true", help="a tiny random model (smoke test)")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be at least 1")
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
        "model": "tiny" if args.tiny else args.model,
        "args": {k: v for k, v in vars(args).items() if k not in ("results", "model")},
        "setting": modes["1_rank"].pop("setting"),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or "?"},
        "torch": torch.__version__,
        "modes": modes,
    }
    modes["2_rank"].pop("setting")
    record["setting"]["summary"] = describe(record)
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / ("fsdp_overhead_tiny.json" if args.tiny else "fsdp_overhead.json")
    path.write_text(json.dumps(record, indent=1))
    print_table(record)
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
