"""Tool rollback + negative samples on and off, from the agent warm start (issues #6, #16).

Two runs of the agent main job (configs/agent_smollm2_grpo.yaml) with the same steps and seed on
calculator + search, whose tools can fail: ``off`` plays episodes as they come; ``on`` rolls
failing tool turns back, retries them and trains on the failed attempts as negative members of
their group. Each arm's final policy is scored greedily on the held-out calculator and search
test sets (200 tasks, no rollback), as is the warm start before training: accuracy and tool
error rate, each with its standard error. During training the error rate counts every call the
policy made, rolled-back attempts included, so the two arms measure the same thing.

Run by hand (SmolLM2: long on a 2-core CPU):  python benchmarks/negatives.py [--steps 12] [k=v ...]
Writes benchmarks/results/negatives.json and negatives.png (or ``--results DIR``) and prints
one table. ``key=value`` overrides apply to both runs, e.g. a tiny model for a smoke test.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import fmean
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from toolgrpo.config.loader import load_config  # noqa: E402
from toolgrpo.config.schema import TrainConfig  # noqa: E402
from toolgrpo.trainer.trainer import Trainer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "agent_smollm2_grpo.yaml"
TASK_TYPES = ("calculator", "search")
MT = "actor_rollout_ref.rollout.multi_turn."
ARMS = {
    "off": [f"{MT}enable_tool_rollback=false"],
    "on": [f"{MT}enable_tool_rollback=true", f"{MT}save_negative_samples=true"],
}
KEPT_PREFIXES = ("episode/", "rollout/", "reward/mean", "batch/size", "timing/step_s", "val/")


def run_arm(name: str, overrides: list[str], out: Path) -> tuple[list[dict[str, float]], float]:
    """One training run; its per-step metrics (the ones this benchmark reads, the final held-out
    validation included) and wall time."""
    cfg = load_config(TrainConfig, CONFIG, [*overrides, *ARMS[name], f"trainer.output_dir={out}"])
    t0 = time.time()
    trainer = Trainer(cfg)
    history = trainer.fit()
    seconds = time.time() - t0
    del trainer
    gc.collect()
    rows = [
        {"step": i + 1, **{k: float(v) for k, v in h.items() if k.startswith(KEPT_PREFIXES)}}
        for i, h in enumerate(history)
    ]
    return rows, seconds


def held_out(metrics: dict[str, float]) -> dict[str, Any]:
    """Greedy held-out accuracy and tool error rate per task type, each with its standard error
    (the error rate's over calls, as a binomial proportion)."""
    out: dict[str, Any] = {}
    for t in TASK_TYPES:
        p = f"val/{t}/"
        if f"{p}accuracy" not in metrics:
            continue
        calls = metrics[f"{p}calls_per_episode"] * metrics[f"{p}episodes"]
        err = metrics[f"{p}tool_error_rate"]
        out[t] = {
            "accuracy": metrics[f"{p}accuracy"],
            "accuracy_se": metrics[f"{p}accuracy_se"],
            "tool_call_rate": metrics[f"{p}tool_call_rate"],
            "tool_error_rate": err,
            "tool_error_rate_se": (err * (1 - err) / calls) ** 0.5 if calls else 0.0,
            "episodes": metrics[f"{p}episodes"],
        }
    return out


def step0_validation(out: Path) -> dict[str, float]:
    """The warm start's held-out metrics, from the run's metrics.jsonl (step 0)."""
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("step") == 0:
            return {k: v for k, v in row.items() if k.startswith("val/")}
    return {}


def summarize(rows: list[dict[str, float]], seconds: float) -> dict[str, Any]:
    """Error rates weighted by calls (overall), per task type averaged over the steps it ran."""

    def rate(part: list[dict[str, float]], prefix: str = "episode/") -> float:
        calls = sum(r.get(f"{prefix}tool_calls/mean", 0.0) for r in part)
        errors = sum(r.get(f"{prefix}tool_errors/mean", 0.0) for r in part)
        return errors / calls if calls else 0.0

    half = rows[len(rows) // 2 :]
    out: dict[str, Any] = {
        "tool_error_rate": rate(rows),
        "tool_error_rate_last_half": rate(half),
        "tool_error_rate_first_step": rate(rows[:1]),
        "reward_mean": fmean(r.get("episode/reward/mean", 0.0) for r in rows),
        "rollbacks": sum(r.get("rollout/rollbacks", 0.0) for r in rows),
        "retries": sum(r.get("rollout/retries", 0.0) for r in rows),
        "negative_samples": sum(r.get("rollout/negative_samples", 0.0) for r in rows),
        "seconds_per_step": seconds / max(len(rows), 1),
    }
    recovered = sum(
        r.get("rollout/retry_success_rate", 0.0) * r.get("rollout/rollbacks", 0.0) for r in rows
    )
    out["retry_success_rate"] = recovered / out["rollbacks"] if out["rollbacks"] else 0.0
    out["held_out_final"] = held_out(rows[-1]) if rows else {}
    for t in TASK_TYPES:
        seen = [r for r in rows if f"episode/{t}/tool_calls/mean" in r]
        out[f"{t}/tool_error_rate"] = rate(seen, f"episode/{t}/") if seen else None
    return out


def plot(runs: dict[str, list[dict[str, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, rows in runs.items():
        steps = [r["step"] for r in rows]
        line = ax.plot(steps, [r.get("episode/tool_error_rate", 0.0) for r in rows], marker="o")
        line[0].set_label(f"negatives {arm}: all task types")
        for t, style in zip(TASK_TYPES, ("--", ":"), strict=True):
            pts = [
                (r["step"], r[f"episode/{t}/tool_error_rate"])
                for r in rows
                if f"episode/{t}/tool_error_rate" in r
            ]
            if pts:
                ax.plot(
                    *zip(*pts, strict=True),
                    style,
                    color=line[0].get_color(),
                    label=f"negatives {arm}: {t}",
                )
    ax.set_xlabel("training step")
    ax.set_ylabel("tool error rate (every call, retries included)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title("Tool error rate with and without rollback + negative samples")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _fmt(h: dict[str, Any], key: str) -> str:
    return f"{h[key]:.3f} ± {h[key + '_se']:.3f}" if h else "-"


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--work", type=Path, default=None, help="run directories (default: a tmp dir)")
    args, extra = ap.parse_known_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="toolgrpo_negatives_"))
    overrides = [
        f"data.train_files=[{','.join(f'{t}:train' for t in TASK_TYPES)}]",
        f"data.val_files=[{','.join(f'{t}:test' for t in TASK_TYPES)}]",
        "data.val_max_samples=-1",  # every held-out task: 100 per type
        f"trainer.total_training_steps={args.steps}",
        f"trainer.test_freq={args.steps}",  # the final policy, scored once
        f"trainer.seed={args.seed}",
        f"data.seed={args.seed}",
        "trainer.logger=[jsonl]",
        "trainer.save_freq=-1",
        "trainer.resume=disable",
        "trainer.overwrite_output_dir=true",  # a re-run replaces (moves aside) the last one
        *extra,
    ]
    runs, summary = {}, {}
    for i, arm in enumerate(ARMS):
        # Both arms start from the same weights: score the warm start once, in the first arm.
        before = [f"trainer.val_before_train={'true' if i == 0 else 'false'}"]
        rows, seconds = run_arm(arm, [*overrides, *before], work / arm)
        runs[arm], summary[arm] = rows, summarize(rows, seconds)
        if i == 0:
            summary["warm_start"] = {"held_out_final": held_out(step0_validation(work / arm))}
    args.results.mkdir(parents=True, exist_ok=True)
    record = {
        "config": str(CONFIG.relative_to(ROOT)),
        "overrides": overrides,
        "arms": {k: v for k, v in ARMS.items()},
        "cpu_flags": cpu_flags(),
        "summary": summary,
        "steps": runs,
    }
    (args.results / "negatives.json").write_text(json.dumps(record, indent=1))
    plot(runs, args.results / "negatives.png")
    t = Table(title=f"Held-out (greedy) after {args.steps} steps, negatives on vs off")
    for c in ("policy", *(f"{ty} {m}" for ty in TASK_TYPES for m in ("accuracy", "tool errors"))):
        t.add_column(c)
    for name in ("warm_start", *ARMS):
        h = summary[name]["held_out_final"]
        cells = []
        for ty in TASK_TYPES:
            cells += [_fmt(h.get(ty, {}), "accuracy"), _fmt(h.get(ty, {}), "tool_error_rate")]
        t.add_row(name if name == "warm_start" else f"negatives {name}", *cells)
    Console(width=150).print(t)
    t = Table(title=f"During training ({args.steps} steps, seed {args.seed})")
    cols = ("negatives", "error rate", "last half", *TASK_TYPES, "reward", "rollbacks")
    for c in (*cols, "retry ok", "negatives kept", "s/step"):
        t.add_column(c)
    for arm in ARMS:
        s = summary[arm]
        per_type = [
            "-" if s[f"{ty}/tool_error_rate"] is None else f"{s[f'{ty}/tool_error_rate']:.3f}"
            for ty in TASK_TYPES
        ]
        t.add_row(
            arm,
            f"{s['tool_error_rate']:.3f}",
            f"{s['tool_error_rate_last_half']:.3f}",
            *per_type,
            f"{s['reward_mean']:.3f}",
            f"{s['rollbacks']:.0f}",
            f"{s['retry_success_rate']:.2f}",
            f"{s['negative_samples']:.0f}",
            f"{s['seconds_per_step']:.1f}",
        )
    Console(width=150).print(t)
    print(f"wrote {args.results / 'negatives.json'} and {args.results / 'negatives.png'}")


def cpu_flags() -> list[str]:
    """The CPU features that decide torch's speed here (AVX2 vs AVX512-BF16)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next(
        (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
    )
    return sorted(f for f in flags if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16"))


if __name__ == "__main__":
    main(sys.argv[1:])
