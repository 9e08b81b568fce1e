"""FSDP2 memory on CPU, 2 gloo ranks: the start (full load vs sharded start) and whole steps.

Start-up: each run spawns 2 fresh ranks that build the actor exactly as the trainer does, up to
where the first step would start (the optimizer's moments are allocated lazily, at the first
step), with every rank sampling (``all``, the default: each keeps a whole rollout copy) or rank 0
alone (``main``):
- ``full``: every rank loads the whole model; a rank that samples keeps it for rollouts and gives
  the actor a full copy; ``fully_shard`` then frees the unsharded tensors. This is the fallback
  for files that cannot be read by rows; here it is forced by telling ``sharded_load`` the files
  cannot.
- ``sharded``: a rank that samples loads its whole rollout copy, any other builds the model on
  the meta device; the actor (and the reference, when the KL loss needs a frozen copy) are
  sharded empty and each rank reads only its rows of each weight from the safetensors files.

Per rank: RSS after imports, the process group, the tokenizer and an empty (meta) build of
the model's modules (the baseline), peak RSS at the end of the
start (``ru_maxrss``, so everything in between counts), and their difference. "One model" is
the policy's weights at their dtype (fp32 for full fine-tuning). The bound the sharded start must
stay under is one full copy of each model the actor shards (the policy, plus the reference when
it is a frozen copy), plus the rollout copy of a rank that samples, over the baseline: what the
full load costs without the second copy. Safetensors files are mmapped, so the file pages a rank
touches count too.

Steps (``--train``): ``toolgrpo train`` of ``configs/grpo_smollm2_rlla.yaml`` (HF rollouts, fp32,
no validation or checkpoint) for ``--train-steps`` steps, in one process and on 2 torchrun ranks
that each sample their share: per rank the peak RSS at the first step's start and over the run,
and each step's seconds (``timing/step_s``, with its generation share).

Run (start-up: about 11 min for both models and both samplings on 2 cores shared with another
job; steps: minutes a step):
    python benchmarks/fsdp_startup_memory.py [--models tiny smollm2-135m] [--settings ...]
        [--sampling all main] [--train] [--train-steps 3] [--note "what else ran"]
Settings: full-kl (full fine-tuning, KL loss on: a frozen reference copy is sharded too) and
lora16 (a fresh rank-16 LoRA, KL on: the reference is the adapter switched off). Merges its rows
into benchmarks/results/fsdp_startup_memory.json (or ``--results DIR``), with the machine's load
(load averages before and after, ``--note``), and prints one table per part.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import socket
import subprocess
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
SAMPLING = ("all", "main")  # every rank samples (the default), or rank 0 alone


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
    ranks = Ranks(rank, world, True, torch.device("cpu"), job["sampling"] == "all")
    policy = sharded_load.start_policy(cfg.actor_rollout_ref.model, ranks)
    actor = Actor(sharded_load.actor_policy(policy, ranks), cfg, 10, ranks)
    seconds = time.perf_counter() - t0
    peak = peak_rss_gib()
    # One model: a sampling rank's whole rollout copy (elsewhere empty or sharded by now).
    whole = policy.model.parameters() if ranks.samples else []
    model_bytes = sum(p.numel() * p.element_size() for p in whole)
    rec = {
        "rank": rank,
        "samples": ranks.samples,
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


def measure(model: str, label: str, setting: str, start: str, sampling: str, work: Path) -> dict:
    out = str(work / f"{label}-{setting}-{start}-{sampling}")
    job = {"model": model, "setting": setting, "start": start, "sampling": sampling}
    load = os.getloadavg()
    mp.spawn(run, args=(2, _free_port(), job, out), nprocs=2, join=True)
    ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(2)]
    model_gib = max(r.pop("model_bytes") for r in ranks) / GIB
    for r in ranks:
        copies = r["sharded_models"] + r["samples"]  # a sampling rank adds its rollout copy
        r["bound_gib"] = r["baseline_gib"] + copies * model_gib
        r["below_bound"] = r["peak_gib"] < r["bound_gib"]
        r["start_models"] = r["start_gib"] / model_gib if model_gib else 0.0
    return {
        "model": label,
        "setting": setting,
        "start": start,
        "sampling": sampling,
        "model_gib": model_gib,
        "load_before": load,
        "ranks": ranks,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title="FSDP2 start-up, 2 gloo ranks: peak RSS per rank (GiB)",
        caption="start = peak − baseline (RSS after imports); bound = baseline + one model per "
        "model sharded (the reference too when it is a frozen copy) + a sampling rank's rollout "
        "copy",
    )
    for c in ("model", "setting", "sampling", "one model", "start", "rank", "baseline", "peak",
              "start", "in models", "bound", "below", "seconds"):  # fmt: skip
        table.add_column(c)
    for row in rows:
        for r in row["ranks"]:
            table.add_row(
                row["model"],
                row["setting"],
                row["sampling"],
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


TRAIN_CONFIG = ROOT / "configs" / "grpo_smollm2_rlla.yaml"


def rank_main(record: str, argv: list[str]) -> int:
    """One process of a ``toolgrpo train`` run (under torchrun, one rank): the command in this
    process, then its RSS before the run, at the first step's start and at its peak."""
    from toolgrpo import cli
    from toolgrpo.trainer.trainer import Trainer

    rank = int(os.environ.get("RANK", "0"))
    rec: dict[str, Any] = {"rank": rank, "baseline_gib": rss_gib()}
    fit = Trainer.fit

    def timed_fit(self):
        rec["start_peak_gib"] = peak_rss_gib()  # the start: weights, rollout copy, shards
        return fit(self)

    Trainer.fit = timed_fit
    rc = cli.main(argv)
    rec.update(rc=rc, peak_gib=peak_rss_gib())
    Path(f"{record}.{rank}").write_text(json.dumps(rec))
    return rc


def train(world: int, steps: int, threads: int, model: str, work: Path) -> dict[str, Any]:
    """``toolgrpo train`` on ``world`` ranks (every rank sampling) or in one process."""
    out = work / f"train-{world}"
    ov = [f"actor_rollout_ref.model.path={model}"] if model else []
    if model and Path(model).is_dir():  # the tiny model's tokenizer spells prompts long
        ov.append("data.max_prompt_length=16384")
    ov += [
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.model.dtype=float32",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[jsonl]",
        "trainer.device=cpu",
        f"trainer.num_threads={threads}",
        f"trainer.distributed.strategy={'fsdp2' if world > 1 else 'none'}",
    ]
    me = [str(Path(__file__).resolve()), "_rank", str(out / "rss"), "train", str(TRAIN_CONFIG)]
    cmd = [sys.executable, *me, *ov, f"trainer.output_dir={out}"]
    if world > 1:
        run = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd = [*run, "--nproc_per_node", str(world), *cmd[1:]]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT / "src")}
    load = os.getloadavg()
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, timeout=4 * 3600)
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    ranks = [json.loads((out / f"rss.{r}").read_text()) for r in range(world)]
    return {
        "world": world,
        "threads_per_rank": threads,
        "config": str(TRAIN_CONFIG.relative_to(ROOT)),
        "overrides": ov,
        "step_s": [r["timing/step_s"] for r in rows],
        "gen_s": [r.get("timing/gen_s") for r in rows],
        "sampling_ranks": [r.get("rollout/sampling_ranks", 1.0) for r in rows],
        "wall_s": wall,
        "load_before": load,
        "load_after": os.getloadavg(),
        "ranks": ranks,
    }


def print_train(runs: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="toolgrpo train, SmolLM2 RLLA job: 1 process vs 2 ranks each sampling")
    for c in ("ranks", "rank", "RSS at start", "peak RSS", "step s (2nd on, mean)", "gen s"):
        table.add_column(c)
    for run in runs:
        later = run["step_s"][1:] or run["step_s"]
        gen = [g for g in run["gen_s"][1:] if g is not None]
        for r in run["ranks"]:
            table.add_row(
                str(run["world"]),
                str(r["rank"]),
                f"{r['start_peak_gib']:.2f}",
                f"{r['peak_gib']:.2f}",
                f"{sum(later) / len(later):.1f}",
                f"{sum(gen) / len(gen):.1f}" if gen else "-",
            )
    Console(width=160).print(table)


def _key(row: dict[str, Any]) -> tuple:
    return (row["model"], row["setting"], row["start"], row.get("sampling", "main"))


def main(argv: list[str]) -> None:
    if argv[:1] == ["_rank"]:  # one process of a --train run
        sys.exit(rank_main(argv[1], argv[2:]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--sampling", nargs="+", default=list(SAMPLING), choices=SAMPLING)
    ap.add_argument("--train", action="store_true", help="also time whole steps (SmolLM2)")
    ap.add_argument("--train-steps", type=int, default=3)
    ap.add_argument("--train-model", default="", help="'tiny' for a smoke test; the config's")
    ap.add_argument("--note", default="", help="what else ran on the machine meanwhile")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="fsdp_startup_"))
    path = args.results / "fsdp_startup_memory.json"
    record = json.loads(path.read_text()) if path.exists() else {}
    old = {_key(r): r for r in record.get("runs", [])}  # rows without "sampling": rank 0 alone
    machine = {"cpus": os.cpu_count(), "processor": platform.processor() or "?"}
    load = {"before": os.getloadavg(), "uptime_before": _uptime(), "note": args.note}
    rows = []
    for label in args.models:
        model = label
        if label == "tiny":
            from toolgrpo.models.tiny import build_tiny_model_dir

            model = str(build_tiny_model_dir(work / "tiny", hidden_size=256, num_layers=4))
        for setting in args.settings:
            for sampling in args.sampling:
                for start in ("full", "sharded"):
                    rows.append(measure(model, label, setting, start, sampling, work))
    for row in rows:
        old[_key(row)] = {**row, "torch": torch.__version__}
    training = record.get("training")
    if args.train:
        threads = max(1, (os.cpu_count() or 2) // 2)
        model = args.train_model
        if model == "tiny":
            from toolgrpo.models.tiny import build_tiny_model_dir

            model = str(build_tiny_model_dir(work / "tiny-train"))
        training = [train(w, args.train_steps, threads * 2 // w, model, work) for w in (1, 2)]
    load.update(after=os.getloadavg(), uptime_after=_uptime())
    record = {
        "machine": machine,
        "torch": torch.__version__,
        "load": load,
        "runs": [{"sampling": "main", **r} for r in old.values()],
        "training": training,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    if rows:
        print_table(rows)
    if args.train:
        print_train(training)
    print(f"wrote {path}")


def _uptime() -> str:
    """``uptime``, and the processes using the most CPU just then (what else ran)."""
    up = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    ps = ["ps", "-eo", "pcpu,etime,args", "--sort=-pcpu"]
    top = subprocess.run(ps, capture_output=True, text=True).stdout.splitlines()[1:6]
    return " | ".join([up, *(" ".join(x.split()[:6])[:160] for x in top)])


if __name__ == "__main__":
    main(sys.argv[1:])
