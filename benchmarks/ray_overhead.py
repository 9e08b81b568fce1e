"""Per-step overhead of Ray mode (rollouts on Ray actors) against the local backend (issue #7).

The same training config runs in three modes: ``local`` (rollouts in the trainer's process), then
Ray with 1 and 2 rollout workers (each Ray mode starts, and stops, its own local cluster). Per
mode: the startup cost (``ray.init``, workers loading the model) and per step the median step
time split into generation, the Ray share of it (dispatch + gather: wall time of the remote
calls minus the slowest worker's own compute) and the weight push (object store put + every
worker loading it). The first step is not measured (warm-up).

Run by hand (SmolLM2: minutes on a 2-core CPU):
    python benchmarks/ray_overhead.py [--steps 4] [--workers 1,2] [--tiny] [key=value ...]
``--tiny`` swaps SmolLM2 for a tiny random model (a smoke test in seconds). Writes
benchmarks/results/ray_overhead.json (or ``--results DIR``) and prints one table.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a throwaway local cluster

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from toolgrpo.config.loader import load_config  # noqa: E402
from toolgrpo.config.schema import TrainConfig  # noqa: E402
from toolgrpo.trainer.trainer import Trainer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "grpo_smollm2_rlla.yaml"
# Small steps of the main config: no validation or checkpoints, only the loop.
DEFAULTS = [
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=4",
    "data.max_response_length=96",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "trainer.resume=disable",
    "trainer.overwrite_output_dir=true",  # a re-run replaces (moves aside) the last one
    "trainer.logger=[jsonl]",
]
TINY = [
    "actor_rollout_ref.model.dtype=float32",
    "data.max_response_length=16",
    "data.max_prompt_length=2048",  # the tiny tokenizer spells RLLA prompts out long
    "data.filter_overlong_prompts=false",
    "data.max_samples=32",
]
MEASURED = (
    "timing/step_s",
    "timing/gen_s",
    "timing/train_s",
    "timing/weight_sync_s",
    "ray/rollout_wall_s",
    "ray/worker_compute_s",
    "ray/dispatch_overhead_s",
    "ray/weight_push_s",
    "ray/weight_put_s",
    "ray/weight_push_mb",
)


def run_mode(workers: int, overrides: list[str], steps: int, work: Path) -> dict[str, Any]:
    """One trainer in ``local`` mode (``workers == 0``) or Ray mode; its startup and the median
    of each timing over the measured steps."""
    cpus = os.cpu_count() or 1
    extra = [
        f"trainer.output_dir={work / f'ray{workers}'}",
        f"trainer.total_training_steps={steps}",
    ]
    if workers:
        extra += [
            "trainer.distributed.backend=ray",
            f"trainer.distributed.num_rollout_workers={workers}",
            # The workers share the cores the local backend generates on.
            f"trainer.distributed.num_cpus_per_worker={max(1, cpus // workers)}",
            f"trainer.distributed.ray_init_kwargs={{num_cpus: {max(cpus, workers)}}}",
        ]
    cfg = load_config(TrainConfig, CONFIG, [*DEFAULTS, *overrides, *extra])
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    startup = time.perf_counter() - t0
    rows = []
    try:
        for step in range(1, steps + 1):
            rows.append(trainer.train_step(step))
            trainer.step = step
    finally:
        pool = trainer.pool
        t0 = time.perf_counter()
        trainer.close()
        close_s = time.perf_counter() - t0
    measured = rows[1:] or rows
    med = {k: statistics.median(r[k] for r in measured) for k in MEASURED if k in measured[0]}
    out: dict[str, Any] = {
        "workers": workers,
        "startup_s": startup,
        "close_s": close_s,
        "steps_measured": len(measured),
        "median": med,
        "tokens_per_step": statistics.median(r["tokens/generated"] for r in measured),
    }
    if pool is not None:
        out["ray_init_s"] = pool.init_s
        out["workers_start_s"] = pool.start_s
        out["worker_restarts"] = pool.restarts
    del trainer, pool
    gc.collect()
    return out


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="steps per mode (the first is warm-up)")
    ap.add_argument("--workers", default="1,2", help="Ray worker counts to compare with local")
    ap.add_argument("--tiny", action="store_true", help="a tiny random model (smoke test)")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args, overrides = ap.parse_known_args(argv)
    work = Path(tempfile.mkdtemp(prefix="toolgrpo_ray_overhead_"))
    if args.tiny:
        from toolgrpo.models.tiny import build_tiny_model_dir

        os.environ.setdefault("TOOLGRPO_CACHE", str(work / "cache"))
        model = build_tiny_model_dir(work / "tiny")
        overrides = [*TINY, f"actor_rollout_ref.model.path={model}", *overrides]
    modes = {"local": run_mode(0, overrides, args.steps, work)}
    for w in (int(x) for x in args.workers.split(",") if x.strip()):
        modes[f"ray_{w}"] = run_mode(w, overrides, args.steps, work)
    local_step = modes["local"]["median"]["timing/step_s"]
    for m in modes.values():
        m["step_overhead_s"] = m["median"]["timing/step_s"] - local_step
        m["step_ratio"] = m["median"]["timing/step_s"] / local_step
    record = {
        "config": str(CONFIG.relative_to(ROOT)),
        "overrides": [*DEFAULTS, *overrides],
        "tiny": args.tiny,
        "steps": args.steps,
        "machine": {
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
        },
        "modes": modes,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / "ray_overhead.json"
    path.write_text(json.dumps(record, indent=1))
    table = Table(title="Ray mode vs local: per-step seconds (median)")
    cols = ("mode", "startup", "step", "overhead", "gen", "Ray dispatch", "weight push", "update")
    for c in cols:
        table.add_column(c)
    for name, m in modes.items():
        med = m["median"]
        push = med.get("ray/weight_push_s", med.get("timing/weight_sync_s", 0.0))
        table.add_row(
            name,
            f"{m['startup_s']:.1f}",
            f"{med['timing/step_s']:.2f}",
            f"{m['step_overhead_s']:+.2f}",
            f"{med['timing/gen_s']:.2f}",
            f"{med.get('ray/dispatch_overhead_s', 0.0):.3f}",
            f"{push:.3f}",
            f"{med['timing/train_s'] - med.get('timing/weight_sync_s', 0.0):.2f}",
        )
    Console().print(table)
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
