"""Does a better fixed rollout policy help the actor, and which estimator uses it right (#17)?

Three runs with the same config, seed, data and number of steps, from the base SmolLM2-135M
(a fresh LoRA) on calculator + search + direct episodes:

- ``actor only``: no fixed policy;
- ``mixture default``: the agent warm start (``smollm2-135m-agent``, better than the base on these
  tasks) samples half of the prompt groups (``per_sample``), corrected by the default decoupled
  estimator (PPO around the actor's own old log-probs × min(π_old/π_fixed, 2), sequence level);
- ``mixture design-literal``: the same, with ``rollout_only.bypass_mode=true`` (π_fixed as the
  PPO old log-probs, the design's method).

Held-out reward (greedy episodes on the first ``--val`` test tasks) before training and every
``--every`` steps; per step the training reward by policy, the share of the fixed policy's groups
with non-zero GRPO advantages, IS weights and their ESS, truncation, clip fractions and the
support gap. Writes ``mixture.json`` and ``mixture.png`` in ``--out`` and prints one table.

Run by hand (SmolLM2; hours on a 2-core CPU, vLLM helps: ``actor_rollout_ref.rollout.name=auto``):
    python benchmarks/mixture.py [--steps 20] [--runs "actor only,mixture default"] [key=value ...]
Any override applies to every run, e.g. a tiny smoke test:
    python benchmarks/mixture.py --steps 1 --val 2 --fixed /tmp/tiny_b \\
        actor_rollout_ref.model.path=/tmp/tiny_a actor_rollout_ref.model.lora_rank=0
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
ENVS = "{calculator: {max_turns: 4}, search: {max_turns: 4}, direct: {max_turns: 2}}"
DEFAULTS = [
    "actor_rollout_ref.model.path=smollm2-135m",  # the base: worse than the fixed policy
    "actor_rollout_ref.model.lora_rank=16",
    "actor_rollout_ref.actor.optim.lr=1e-4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "data.train_files=[calculator:train,search:train,direct:train]",
    "data.val_files=[calculator:test,search:test,direct:test]",
    "data.max_prompt_length=1536",
    "data.max_response_length=512",
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.generation_batch_size=8",
    "actor_rollout_ref.rollout.multi_turn.enable=true",
    "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn=160",
    f"actor_rollout_ref.rollout.multi_turn.envs={ENVS}",
    "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=320",
    "trainer.val_before_train=true",
    "trainer.logger=[jsonl]",
    "trainer.resume=disable",
    "trainer.overwrite_output_dir=true",
    "trainer.save_freq=-1",
    "trainer.save_hf_model=false",
]
KEYS: dict[str, str | tuple[str, ...]] = {  # name in the JSON -> metric (first one present)
    "reward": "reward/mean",
    "reward_actor": "rollout/reward_actor",
    "reward_fixed": "rollout/reward_fixed",
    "val_reward": ("val/episode/reward/mean", "val/reward/mean"),  # episodes; single-turn
    "val_accuracy": "val/all/accuracy",
    "using_fixed": "rollout/using_fixed",
    "fixed_groups_with_signal": "rollout/fixed_groups_with_signal",
    "is_weight_mean": "actor/importance_weight_mean",
    "is_weight_max": "actor/importance_weight_max",
    "is_weight_ess": "actor/importance_weight_ess",
    "fixed_seq_ess": "rollout/fixed_seq_ess",
    "truncated_frac": "actor/importance_weight_truncated_frac",
    "clipfrac": "actor/clipfrac",
    "clipfrac_lower": "actor/clipfrac_lower",
    "support_gap": "actor/is_support_gap",
    "step_s": "timing/step_s",
}


def runs(fixed: str) -> dict[str, list[str]]:
    mix = [
        f"rollout_only.model_path={fixed}",
        "rollout_allocation_schedule.type=constant",
        "rollout_allocation_schedule.alpha=0.5",
        # Per-group draws: over a handful of steps, per-step coin flips would realise α poorly.
        "rollout_allocation_schedule.per_sample=true",
    ]
    return {
        "actor only": [],
        "mixture default": mix,
        "mixture design-literal": [*mix, "rollout_only.bypass_mode=true"],
    }


def _get(rec: dict, metric: str | tuple[str, ...]) -> float | None:
    names = (metric,) if isinstance(metric, str) else metric
    return next((rec[n] for n in names if rec.get(n) is not None), None)


def run_one(config: Path | None, overrides: list[str]) -> tuple[list[dict], float]:
    out = tempfile.mkdtemp(prefix="toolgrpo_mixture_")
    cfg = load_config(TrainConfig, config, [*overrides, f"trainer.output_dir={out}"])
    t0 = time.time()
    trainer = Trainer(cfg)
    try:
        trainer.fit()
    finally:
        trainer.close()
    wall = time.time() - t0
    lines = (Path(out) / "metrics.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines if line.strip()]
    rows = [{"step": r["step"], **{k: _get(r, m) for k, m in KEYS.items()}} for r in recs]
    return rows, wall


def _mean(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return fmean(vals) if vals else None


def summary(rows: list[dict], wall: float) -> dict:
    train = [r for r in rows if r["step"] > 0 and r["reward"] is not None]
    val = [r for r in rows if r["val_reward"] is not None]
    out = {k: _mean(train, k) for k in KEYS if k not in ("val_reward", "val_accuracy", "step_s")}
    out.update(
        val_reward_first=val[0]["val_reward"] if val else None,
        val_reward_last=val[-1]["val_reward"] if val else None,
        val_reward_best=max(r["val_reward"] for r in val) if val else None,
        val_accuracy_first=val[0]["val_accuracy"] if val else None,
        val_accuracy_last=val[-1]["val_accuracy"] if val else None,
        wall_s=wall,
    )
    return out


def plot(results: dict, path: Path) -> None:
    """Held-out reward per run; training reward by sampling policy; ESS and clip fractions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for name, res in results.items():
        steps = res["steps"]
        val = [r for r in steps if r["val_reward"] is not None]
        line = axes[0].plot([r["step"] for r in val], [r["val_reward"] for r in val], "o-")
        line[0].set_label(name)
        color = line[0].get_color()
        train = [r for r in steps if r["step"] > 0]
        for key, style in (("reward_actor", "o-"), ("reward_fixed", "s--")):
            pts = [(r["step"], r[key]) for r in train if r[key] is not None]
            if pts:
                axes[1].plot(*zip(*pts, strict=True), style, color=color, label=f"{name} {key[7:]}")
        for key, style in (("fixed_seq_ess", "o-"), ("clipfrac", "x:")):
            pts = [(r["step"], r[key]) for r in train if r[key] is not None]
            if pts:
                axes[2].plot(*zip(*pts, strict=True), style, color=color, label=f"{name} {key}")
    axes[0].set(title="held-out reward (greedy episodes)", xlabel="step", ylabel="reward")
    axes[1].set(title="training reward by sampling policy", xlabel="step")
    axes[2].set(title="fixed rows' sequence ESS, PPO clip fraction", xlabel="step")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="", help="a base YAML under the defaults' overrides")
    ap.add_argument("--fixed", default="smollm2-135m-agent", help="the fixed policy's model")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--every", type=int, default=5, help="held-out evaluation every N steps")
    ap.add_argument("--val", type=int, default=30, help="held-out tasks (first N of the files)")
    ap.add_argument("--runs", default="", help="comma-separated subset of the run names")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--replot", action="store_true", help="redraw the PNG from the JSON in --out")
    args, overrides = ap.parse_known_args(argv)
    out = Path(args.out)
    if args.replot:
        plot(json.loads((out / "mixture.json").read_text())["runs"], out / "mixture.png")
        return
    config = Path(args.config) if args.config else None
    base = [
        *DEFAULTS,
        f"trainer.total_training_steps={args.steps}",
        f"trainer.test_freq={args.every}",
        f"data.val_max_samples={args.val}",
        *overrides,
    ]
    chosen = runs(args.fixed)
    if args.runs:
        names = [n.strip() for n in args.runs.split(",")]
        unknown = set(names) - set(chosen)
        if unknown:
            ap.error(f"unknown run(s) {sorted(unknown)}; known: {', '.join(chosen)}")
        chosen = {n: chosen[n] for n in names}
    results = {}
    for name, extra in chosen.items():
        rows, wall = run_one(config, [*base, *extra])
        results[name] = {"overrides": extra, "steps": rows, "summary": summary(rows, wall)}
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "config": str(config) if config else None,
        "overrides": base,
        "fixed": args.fixed,
        "steps": args.steps,
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or "unknown"},
        "runs": results,
    }
    (out / "mixture.json").write_text(json.dumps(doc, indent=1))
    plot(results, out / "mixture.png")
    table = Table(title=f"mixture of rollout policies, {args.steps} steps, fixed = {args.fixed}")
    cols = [
        "run",
        "val reward first→last (best)",
        "val acc first→last",
        "reward actor",
        "reward fixed",
        "fixed groups w/ adv",
    ]
    for c in [*cols, "seq ESS", "IS w mean", "trunc", "clipfrac", "support gap", "wall s"]:
        table.add_column(c)

    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    for name, res in results.items():
        s = res["summary"]
        table.add_row(
            name,
            f"{f(s['val_reward_first'])}→{f(s['val_reward_last'])} ({f(s['val_reward_best'])})",
            f"{f(s['val_accuracy_first'])}→{f(s['val_accuracy_last'])}",
            f(s["reward_actor"] if s["reward_actor"] is not None else s["reward"]),
            f(s["reward_fixed"]),
            f(s["fixed_groups_with_signal"]),
            f(s["fixed_seq_ess"]),
            f(s["is_weight_mean"]),
            f(s["truncated_frac"]),
            f(s["clipfrac"]),
            f(s["support_gap"]),
            f"{s['wall_s']:.0f}",
        )
    Console(width=180).print(table)
    print(f"wrote {out / 'mixture.json'} and {out / 'mixture.png'}")


if __name__ == "__main__":
    main(sys.argv[1:])
