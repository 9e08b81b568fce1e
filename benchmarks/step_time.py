"""The agent main job's step time on each rollout backend, measured in one invocation (issue #19).

Runs ``configs/agent_smollm2_grpo.yaml`` (SmolLM2-135M agent warm start + LoRA, calculator /
search / direct episodes, 8 tasks × n=4) for a few steps under each backend — ``hf``
(transformers ``generate``) and the default ``auto`` (vLLM where it is installed) — each in its
own process, alternating over ``--rounds`` so that a change in the machine's load touches both.
The first step of every process is left out (allocator warm-up, engine start). Both backends
draw the same tasks in the same order; the episodes they sample differ, so the table also gives
the update's time per episode token (everything after the prompt).

Per backend: the median step split (generation with tool calls inside it: they run while other
episodes generate, so their summed time is given apart; weight push; log-probs; update), sampled
tokens/s over the generation phase and each process's peak RSS (``wait4``); then the default
backend's step as a ratio of HF's (the issue's goal: ≤ 0.6×).

``--arms default compiled`` instead compares the default backend with and without both compile
switches (``actor.use_torch_compile``, ``rollout.enforce_eager=false``); the first arm is the
ratio's reference.

Run by hand (about 25 minutes on a 2-core CPU at the defaults; run it alone):
    python benchmarks/step_time.py [--steps 3] [--rounds 2] [--arms hf default] [--markdown]
        [key=value ...]
Writes benchmarks/results/step_time.{json,png} (other arms: step_time_<arms>.{json,png}; or
``--results DIR``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_runs import IN_HOUSE, cpu_flags  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "agent_smollm2_grpo.yaml"
CLI = [sys.executable, "-m", "toolgrpo.cli"]
# An arm: its rollout backend and the overrides it adds. ``compiled`` is the default backend with
# both compile switches on (the update through ``torch.compile``, vLLM's CUDA-graph-free compiled
# model), which the main job's config leaves off; ``--arms default compiled`` compares the two.
ARMS: dict[str, tuple[str, list[str]]] = {
    "hf": ("hf", []),
    "default": ("auto", []),
    "compiled": (
        "auto",
        [
            "actor_rollout_ref.actor.use_torch_compile=true",
            "actor_rollout_ref.rollout.enforce_eager=false",
        ],
    ),
}
SPLIT = ("gen_s", "tool_s", "weight_sync_s", "logprob_s", "train_s", "step_s")
# The kept step times were measured on the three environment types; the runs name them so that a
# rerun measures the same job whatever the main job's task mix becomes.
QUIET = [
    IN_HOUSE,
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "trainer.logger=[jsonl]",
    "trainer.resume=disable",
    "trainer.overwrite_output_dir=true",
]


def run_arm(name: str, steps: int, overrides: list[str], out: Path) -> dict[str, Any]:
    """One training process of one arm: its per-step rows, its startup line and peak RSS."""
    backend, extra = ARMS[name]
    cmd = [
        *CLI,
        "train",
        str(CONFIG),
        *QUIET,
        f"actor_rollout_ref.rollout.name={backend}",
        f"trainer.total_training_steps={steps}",
        f"trainer.output_dir={out}",
        f"trainer.rollout_data_dir={out / 'rollout_data'}",
        *extra,
        *overrides,
    ]
    log = out.parent / f"{out.name}.log"
    t0 = time.time()
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{tail}")
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln]
    rows = [r for r in rows if r.get("step", 0) > 0]
    said = [ln for ln in log.read_text().splitlines() if "rollout backend" in ln]
    return {
        "rows": rows,
        "backend_line": said[0].strip() if said else None,
        "peak_rss_gb": usage.ru_maxrss / 1024**2,  # KiB on Linux
        "wall_s": time.time() - t0,
    }


def summarize(procs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over every process's steps after its first."""
    rows = [r for p in procs for r in p["rows"][1:]] or [r for p in procs for r in p["rows"]]
    med = {k: median(r.get(f"timing/{k}", 0.0) for r in rows) for k in SPLIT}
    gen_tokens = median(r.get("tokens/generated", 0.0) for r in rows)
    trained = [
        r["timing/train_s"] / max(r["response_length/mean"] * r["batch/size"], 1.0) for r in rows
    ]
    return {
        "steps_measured": len(rows),
        "median_s": med,
        "step_s_all": [r["timing/step_s"] for r in rows],
        "sampled_tokens_per_s": gen_tokens / med["gen_s"] if med["gen_s"] else None,
        "update_ms_per_episode_token": 1e3 * median(trained),
        "response_length_mean": median(r["response_length/mean"] for r in rows),
        "reward_mean": median(r["reward/mean"] for r in rows),
        "peak_rss_gb": max(p["peak_rss_gb"] for p in procs),
        "backend_line": procs[0]["backend_line"],
    }


def table(result: dict[str, Any], markdown: bool) -> None:
    cols = [
        "backend",
        "step s",
        "generation s",
        "tool calls s (Σ over episodes)",
        "weight push s",
        "update s",
        "update ms / token",
        "sampled tok/s",
        "peak RSS GB",
        f"step / {result['reference']}",
    ]
    ref = result["backends"][result["reference"]]["median_s"]["step_s"]
    lines = []
    for name, s in result["backends"].items():
        m = s["median_s"]
        lines.append(
            [
                name,
                f"{m['step_s']:.1f}",
                f"{m['gen_s']:.1f}",
                f"{m['tool_s']:.1f}",
                f"{m['weight_sync_s']:.1f}",
                f"{m['train_s']:.1f}",
                f"{s['update_ms_per_episode_token']:.1f}",
                f"{s['sampled_tokens_per_s']:.1f}",
                f"{s['peak_rss_gb']:.1f}",
                f"{m['step_s'] / ref:.2f}",
            ]
        )
    if markdown:
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        for ln in lines:
            print("| " + " | ".join(ln) + " |")
        return
    t = Table(title=f"agent main job, median step ({result['dtype_note']})")
    for c in cols:
        t.add_column(c)
    for ln in lines:
        t.add_row(*ln)
    Console().print(t)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["backends"])
    parts = [
        ("generation (episodes, tools included)", "gen_s"),
        ("weight push", "weight_sync_s"),
        ("log-probs", "logprob_s"),
        ("update", "train_s"),
    ]
    fig, ax = plt.subplots(figsize=(6, 3))
    left = [0.0] * len(names)
    for label, key in parts:
        vals = [result["backends"][n]["median_s"][key] for n in names]
        ax.barh(names, vals, left=left, label=label)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_xlabel("seconds per step (median)")
    ax.set_title("agent main job: step split by arm")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="steps per process (the first is dropped)")
    ap.add_argument("--rounds", type=int, default=2, help="processes per arm, alternating")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument(
        "--arms",
        nargs="+",
        default=["hf", "default"],
        choices=list(ARMS),
        help="what to compare; the first is the reference of the ratio column",
    )
    args, overrides = ap.parse_known_args(argv)
    work = Path(tempfile.mkdtemp(prefix="toolgrpo_step_time_"))
    load_start = os.getloadavg()
    procs: dict[str, list[dict[str, Any]]] = {n: [] for n in args.arms}
    for rnd in range(args.rounds):
        for name in args.arms:
            print(f"round {rnd + 1}/{args.rounds}: {name}", flush=True)
            procs[name].append(run_arm(name, args.steps, overrides, work / f"{name}_{rnd}"))
    result: dict[str, Any] = {
        "config": str(CONFIG.relative_to(ROOT)),
        "overrides": overrides,
        "steps_per_process": args.steps,
        "rounds": args.rounds,
        "machine": {
            "cpus": os.cpu_count(),
            "cpu_flags": cpu_flags(),
            "load_avg_start": load_start,
            "load_avg_end": os.getloadavg(),
        },
        "dtype_note": "dtype: auto (bf16 where the CPU has AVX512-BF16/AMX, else fp32)",
        "arm_overrides": {n: ARMS[n][1] for n in args.arms},
        "reference": args.arms[0],
        "backends": {n: summarize(p) for n, p in procs.items()},
    }
    b = result["backends"]
    stem = "step_time" if args.arms == ["hf", "default"] else "step_time_" + "_".join(args.arms)
    if {"hf", "default"} <= set(b):
        ratio = b["default"]["median_s"]["step_s"] / b["hf"]["median_s"]["step_s"]
        result["default_over_hf"] = ratio
        print(f"default / HF step: {ratio:.2f} (goal ≤ 0.6)")
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / f"{stem}.json"
    path.write_text(json.dumps(result, indent=1))
    plot(result, args.results / f"{stem}.png")
    table(result, args.markdown)
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
