"""Tool error rate over training with tool rollback + negative samples on and off (issue #6).

Two runs of the trainer from the same config, steps and seed, on task types whose tools can fail
(calculator, BFCL multi-turn): ``off`` plays episodes as they come; ``on`` rolls failing tool
turns back, retries them and trains on the failed attempts as negative members of their group.
The tool error rate counts every call the policy made, rolled-back attempts included, so the
two arms measure the same thing.

Run by hand (SmolLM2: long on a 2-core CPU):  python benchmarks/negatives.py [--steps 8] [k=v ...]
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
CONFIG = ROOT / "configs" / "multiturn_smollm2_mixed.yaml"
TASK_TYPES = ("calculator", "bfcl_multi_turn")
MT = "actor_rollout_ref.rollout.multi_turn."
ARMS = {
    "off": [f"{MT}enable_tool_rollback=false"],
    "on": [f"{MT}enable_tool_rollback=true", f"{MT}save_negative_samples=true"],
}
KEPT_PREFIXES = ("episode/", "rollout/", "reward/mean", "batch/size", "timing/step_s")


def run_arm(name: str, overrides: list[str], out: Path) -> tuple[list[dict[str, float]], float]:
    """One training run; its per-step metrics (the ones this benchmark reads) and wall time."""
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


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--work", type=Path, default=None, help="run directories (default: a tmp dir)")
    args, extra = ap.parse_known_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="toolgrpo_negatives_"))
    overrides = [
        f"data.train_files=[{','.join(f'{t}:train' for t in TASK_TYPES)}]",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.seed={args.seed}",
        f"data.seed={args.seed}",
        "trainer.logger=[jsonl]",
        "trainer.save_freq=-1",
        "trainer.resume=disable",
        "trainer.overwrite_output_dir=true",  # a re-run replaces (moves aside) the last one
        "trainer.test_freq=-1",
        *extra,
    ]
    runs, summary = {}, {}
    for arm in ARMS:
        rows, seconds = run_arm(arm, overrides, work / arm)
        runs[arm], summary[arm] = rows, summarize(rows, seconds)
    args.results.mkdir(parents=True, exist_ok=True)
    record = {
        "config": str(CONFIG.relative_to(ROOT)),
        "overrides": overrides,
        "arms": {k: v for k, v in ARMS.items()},
        "summary": summary,
        "steps": runs,
    }
    (args.results / "negatives.json").write_text(json.dumps(record, indent=1))
    plot(runs, args.results / "negatives.png")
    t = Table(title=f"Tool error rate, negatives on vs off ({args.steps} steps, seed {args.seed})")
    cols = (
        "negatives",
        "error rate",
        "last half",
        *TASK_TYPES,
        "reward",
        "rollbacks",
        "retry ok",
        "negatives kept",
        "s/step",
    )
    for c in cols:
        t.add_column(c)
    for arm, s in summary.items():
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


if __name__ == "__main__":
    main(sys.argv[1:])
