"""FSDP2 start-up memory: the full load on every rank vs the sharded start, 2 gloo ranks on CPU.

Each run spawns 2 fresh ranks that build the actor exactly as the trainer does, up to where the
first step would start (the optimizer's moments are allocated lazily, at the first step):
- ``full``: every rank loads the whole model; rank 0 keeps it for rollouts and gives the actor a
  full copy; ``fully_shard`` then frees the unsharded tensors. This is the fallback for files
  that cannot be read by rows; here it is forced by telling ``sharded_load`` the files cannot.
- ``sharded``: rank 0 loads its whole rollout copy, every other rank builds the model on the
  meta device; the actor (and the reference, when the KL loss needs a frozen copy) are sharded
  empty and each rank reads only its rows of each weight from the safetensors files.

Per rank: RSS after imports, the process group, the tokenizer and an empty (meta) build of
the model's modules (the baseline), peak RSS at the end of the
start (``ru_maxrss``, so everything in between counts), and their difference. "One model" is
the policy's weights at their dtype (fp32 for full fine-tuning). The bound the sharded start must
stay under is one full copy of each model the actor shards (the policy, plus the reference when
it is a frozen copy), plus the rollout copy on rank 0, over the baseline: what the full load
costs without rank 0's second copy. Safetensors files are mmapped, so the file pages a rank
touches count too.

Run (about 11 min for both models on 2 cores shared with another job):
    python benchmarks/fsdp_startup_memory.py [--models tiny smollm2-135m] [--settings ...]
Settings: full-kl (full fine-tuning, KL loss on: a frozen reference copy is sharded too) and
lora16 (a fresh rank-16 LoRA, KL on: the reference is the adapter switched off). Writes
benchmarks/results/fsdp_startup_memory.json (or ``--results DIR``) and prints one table.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import socket
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
GIB = 2**30
SETTINGS = {  # name: (LoRA rank, KL loss): full-kl shards a frozen reference copy as well
    "full-kl": (0, True),
    "lora16": (16, True),
}


def rss_gib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / GIB


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def make_config(model: str, setting: str) -> Any:
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig

    lora, kl = SETTINGS[setting]
    ov = [
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.dtype=float32",
        f"actor_rollout_ref.model.lora_rank={lora}",
        "data.train_batch_size=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        f"actor_rollout_ref.actor.use_kl_loss={str(kl).lower()}",
        "trainer.device=cpu",
    ]
    return load_config(TrainConfig, None, ov)


def run(rank: int, world: int, port: int, job: dict[str, str], out: str) -> None:
    """One start on one rank; every rank writes its record."""
    import torch.distributed as dist

    from toolgrpo.distributed import sharded_load
    from toolgrpo.distributed.fsdp import Ranks, leave_process_group
    from toolgrpo.trainer.actor import Actor

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    if job["start"] == "full":  # the load before the sharded start, as for .bin files
        sharded_load.blocker = lambda hf_dir: "forced by the benchmark"
    cfg = make_config(job["model"], job["setting"])
    _import_model_code(job["model"])
    gc.collect()
    base = rss_gib()
    t0 = time.perf_counter()
    torch.manual_seed(0)
    ranks = Ranks(rank, world, True, torch.device("cpu"))
    policy = sharded_load.start_policy(cfg.actor_rollout_ref.model, ranks)
    actor = Actor(sharded_load.actor_policy(policy, ranks), cfg, 10, ranks)
    seconds = time.perf_counter() - t0
    peak = peak_rss_gib()
    # One model: rank 0's whole rollout copy (elsewhere the model is empty or sharded by now).
    whole = policy.model.parameters() if ranks.main else []
    model_bytes = sum(p.numel() * p.element_size() for p in whole)
    rec = {
        "rank": rank,
        "baseline_gib": base,
        "peak_gib": peak,
        "start_gib": peak - base,
        "end_gib": rss_gib(),
        "seconds": seconds,
        "model_bytes": model_bytes,
        "reference": "none" if actor.ref is None else "frozen copy, sharded",
        "sharded_models": 1 + (actor.ref is not None),
    }
    Path(f"{out}.{rank}").write_text(json.dumps(rec))
    leave_process_group()


def _import_model_code(model: str) -> None:
    """What loading imports and keeps either way (modeling modules, PEFT, the tokenizer), so
    the baseline holds it and the start's difference is the weights."""
    import peft  # noqa: F401

    from toolgrpo.models.loading import empty_model, load_tokenizer
    from toolgrpo.models.registry import resolve_model

    hf_dir = resolve_model(model).hf_dir
    load_tokenizer(hf_dir)
    empty_model(hf_dir, torch.float32)  # dropped at once: parameters on meta take no memory


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(model: str, label: str, setting: str, start: str, work: Path) -> dict[str, Any]:
    out = str(work / f"{label}-{setting}-{start}")
    job = {"model": model, "setting": setting, "start": start}
    mp.spawn(run, args=(2, _free_port(), job, out), nprocs=2, join=True)
    ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(2)]
    model_gib = max(r.pop("model_bytes") for r in ranks) / GIB
    for r in ranks:
        copies = r["sharded_models"] + (r["rank"] == 0)  # rank 0 adds its rollout copy
        r["bound_gib"] = r["baseline_gib"] + copies * model_gib
        r["below_bound"] = r["peak_gib"] < r["bound_gib"]
        r["start_models"] = r["start_gib"] / model_gib if model_gib else 0.0
    return {
        "model": label,
        "setting": setting,
        "start": start,
        "model_gib": model_gib,
        "ranks": ranks,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title="FSDP2 start-up, 2 gloo ranks: peak RSS per rank (GiB)",
        caption="start = peak − baseline (RSS after imports); bound = baseline + one model per "
        "model sharded (the reference too when it is a frozen copy) + the rollout copy on rank 0",
    )
    for c in ("model", "setting", "one model", "start", "rank", "baseline", "peak", "start",
              "in models", "bound", "below", "seconds"):  # fmt: skip
        table.add_column(c)
    for row in rows:
        for r in row["ranks"]:
            table.add_row(
                row["model"],
                row["setting"],
                f"{row['model_gib']:.3f}",
                row["start"],
                str(r["rank"]),
                f"{r['baseline_gib']:.3f}",
                f"{r['peak_gib']:.3f}",
                f"{r['start_gib']:.3f}",
                f"{r['start_models']:.2f}",
                f"{r['bound_gib']:.3f}",
                "yes" if r["below_bound"] else "no",
                f"{r['seconds']:.1f}",
            )
    Console(width=160).print(table)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="fsdp_startup_"))
    rows = []
    for label in args.models:
        model = label
        if label == "tiny":
            from toolgrpo.models.tiny import build_tiny_model_dir

            model = str(build_tiny_model_dir(work / "tiny", hidden_size=256, num_layers=4))
        for setting in args.settings:
            for start in ("full", "sharded"):
                rows.append(measure(model, label, setting, start, work))
    record = {
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or "?"},
        "torch": torch.__version__,
        "runs": rows,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / "fsdp_startup_memory.json"
    path.write_text(json.dumps(record, indent=1))
    print_table(rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
