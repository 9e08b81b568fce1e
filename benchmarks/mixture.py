"""Reward curves with a fixed rollout policy sharing rollout duty (issue #5).

Three runs with the same config, seed and number of steps: α = 1.0 (the actor samples every
step), α = 0.5, and a linear schedule from α ≈ 0.25 up to 1.0 at the last step; the mixed runs
draw the policy per prompt group (``per_sample``), so a short run realises α closely. The
fixed policy defaults to the base SmolLM2-135M-Instruct at temperature 0.8; the actor is the
main job's warm start. Writes ``mixture.json`` and ``mixture.png`` and prints one table.

Run by hand (about an hour on a 2-core CPU with SmolLM2):
    python benchmarks/mixture.py [--config FILE] [--out DIR] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from statistics import fmean

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from toolgrpo.config.loader import load_config  # noqa: E402
from toolgrpo.config.schema import TrainConfig  # noqa: E402
from toolgrpo.trainer.trainer import Trainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "configs" / "grpo_smollm2_rlla.yaml"
DEFAULTS = [
    "rollout_only.model_path=smollm2-135m",
    "rollout_only.temperature=0.8",
    "trainer.logger=[jsonl]",
    "trainer.resume=disable",
    "trainer.overwrite_output_dir=true",  # a re-run replaces (moves aside) the last one
    "trainer.save_hf_model=false",
]
KEYS = {  # what each step row keeps: name in the JSON -> metric
    "reward": "reward/mean",
    "reward_actor": "rollout/reward_actor",
    "reward_fixed": "rollout/reward_fixed",
    "val_reward": "val/reward/mean",
    "alpha": "rollout/alpha",
    "using_fixed": "rollout/using_fixed",
    "is_weight_mean": "actor/importance_weight_mean",
    "is_weight_ess": "actor/importance_weight_ess",
    "clipfrac": "actor/clipfrac",
    "step_s": "timing/step_s",
}


def runs(steps: int) -> dict[str, list[str]]:
    s = "rollout_only.schedule"
    return {
        "alpha=1.0": [f"{s}.type=constant", f"{s}.alpha=1.0", "rollout_only.offload=true"],
        # Per-sample draws: over a handful of steps, per-step coin flips would realise α poorly.
        "alpha=0.5": [f"{s}.type=constant", f"{s}.alpha=0.5", f"{s}.per_sample=true"],
        "linear": [
            f"{s}.type=linear",
            f"{s}.alpha0=0.25",
            f"{s}.beta={0.75 / steps:.6g}",
            f"{s}.per_sample=true",
        ],
    }


def run_one(config: Path | None, overrides: list[str]) -> tuple[list[dict], float]:
    out = tempfile.mkdtemp(prefix="toolgrpo_mixture_")
    cfg = load_config(TrainConfig, config, [*overrides, f"trainer.output_dir={out}"])
    t0 = time.time()
    Trainer(cfg).fit()
    wall = time.time() - t0
    lines = (Path(out) / "metrics.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines if line.strip()]
    rows = [{"step": r["step"], **{k: r.get(m) for k, m in KEYS.items()}} for r in recs]
    return rows, wall


def _mean(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return fmean(vals) if vals else None


def summary(rows: list[dict], wall: float) -> dict:
    train = [r for r in rows if r["step"] > 0 and r["reward"] is not None]
    half = train[len(train) // 2 :]
    val = [r for r in rows if r["val_reward"] is not None]
    return {
        "reward_mean": _mean(train, "reward"),
        "reward_mean_second_half": _mean(half, "reward"),
        "reward_actor_mean": _mean(train, "reward_actor"),
        "val_reward_first": val[0]["val_reward"] if val else None,
        "val_reward_last": val[-1]["val_reward"] if val else None,
        "fixed_share": _mean(train, "using_fixed"),
        "is_weight_mean": _mean(train, "is_weight_mean"),
        "is_weight_ess": _mean(train, "is_weight_ess"),
        "clipfrac": _mean(train, "clipfrac"),
        "wall_s": wall,
    }


def plot(results: dict, path: Path) -> None:
    """Training reward per run; beside it the held-out reward when the runs validated, else the
    reward of each sampling policy's rows (actor solid, fixed dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    has_val = any(r["val_reward"] is not None for res in results.values() for r in res["steps"])
    for name, res in results.items():
        train = [r for r in res["steps"] if r["step"] > 0]
        line = ax1.plot([r["step"] for r in train], [r["reward"] for r in train], marker="o")
        line[0].set_label(name)
        color = line[0].get_color()
        if has_val:
            val = [r for r in res["steps"] if r["val_reward"] is not None]
            ax2.plot([r["step"] for r in val], [r["val_reward"] for r in val], "o-", color=color)
            continue
        for key, style in (("reward_actor", "o-"), ("reward_fixed", "s--")):
            pts = [(r["step"], r[key]) for r in train if r[key] is not None]
            if pts:
                ax2.plot(*zip(*pts, strict=True), style, color=color, label=f"{name} {key[7:]}")
    ax1.set(title="training reward (all samples)", xlabel="step", ylabel="reward")
    if has_val:
        ax2.set(title="held-out reward (actor, greedy)", xlabel="step")
    else:
        ax2.set(title="training reward by sampling policy", xlabel="step")
        ax2.legend(fontsize=7)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    ax1.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(DEFAULT_CONFIG), help="base YAML ('' for none)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--replot", action="store_true", help="redraw the PNG from the JSON in --out")
    args, overrides = ap.parse_known_args(argv)
    if args.replot:
        out = Path(args.out)
        plot(json.loads((out / "mixture.json").read_text())["runs"], out / "mixture.png")
        return
    config = Path(args.config) if args.config else None
    base = [*DEFAULTS, *overrides]
    steps = load_config(TrainConfig, config, base).trainer.total_training_steps
    results = {}
    for name, extra in runs(steps).items():
        rows, wall = run_one(config, [*base, *extra])
        results[name] = {"overrides": extra, "steps": rows, "summary": summary(rows, wall)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "config": str(config) if config else None,
        "overrides": base,
        "steps": steps,
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or "unknown"},
        "runs": results,
    }
    (out / "mixture.json").write_text(json.dumps(doc, indent=1))
    plot(results, out / "mixture.png")
    table = Table(title=f"mixture of rollout policies, {steps} steps")
    cols = ["run", "reward", "reward 2nd half", "actor reward", "val first→last", "fixed share"]
    for c in [*cols, "IS w mean", "ESS", "clipfrac", "wall s"]:
        table.add_column(c)

    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    for name, res in results.items():
        s = res["summary"]
        table.add_row(
            name,
            f(s["reward_mean"]),
            f(s["reward_mean_second_half"]),
            f(s["reward_actor_mean"]),
            f"{f(s['val_reward_first'])}→{f(s['val_reward_last'])}",
            f(s["fixed_share"]),
            f(s["is_weight_mean"]),
            f(s["is_weight_ess"]),
            f(s["clipfrac"]),
            f"{s['wall_s']:.0f}",
        )
    Console(width=160).print(table)
    print(f"wrote {out / 'mixture.json'} and {out / 'mixture.png'}")


if __name__ == "__main__":
    main(sys.argv[1:])
