"""Tool rollback that does not hide failures: four ways to treat a failed tool call, trained from
the agent warm start and scored held out, paired by task against no rollback.

Arms (docs/multi_turn.md, "Tool-call rollback"): ``no_rollback``; ``rollback_negatives`` (the
default: ``retry``, every retried failure a negative scored -1, no cap); ``negatives_r0`` (the
same with ``negative_reward: 0``, so the negatives carry about half their share of the update);
``fission`` (Fission-GRPO: an episode's first failed call forks a group of continuations sampled
from its error feedback, trained as their own GRPO group). For each arm and seed, ``toolgrpo
train configs/agent_smollm2_grpo.yaml`` on calculator + search (the task types whose tools can
fail), then ``toolgrpo eval`` of the final checkpoint on every held-out
calculator and search task (200, greedy, no rollback), paired by task with ``no_rollback`` of
the same seed (``toolgrpo.eval.paired``). Finished runs and evals are reused, so an interrupted
run resumes where it stopped; one ``--work`` holds one setting (its overrides are checked). Each
eval (without its episodes' text), each finished run's training metrics and the setting are also
kept in git, in ``benchmarks/results/<out>_kept/``: a later checkout reuses a kept (arm, seed)
without training or evaluating it, and ``--report`` works from the kept copies alone.

    python benchmarks/negatives.py --seeds 0 1 2            # ~4 runs x 35 min a seed on 2 cores
    python benchmarks/negatives.py --seeds 0 1 2 --report   # only re-read what is there

Each directory records the overrides of the arms it holds runs of (``arms.json``; one without it
holds the arms as first run, ``LEGACY_ARMS``): runs of an arm whose overrides changed since (the
first ``fission`` arm, which relabelled instead of forking) are refused, never reused.

Writes ``benchmarks/results/negatives.json``: ``arms.<name>`` with ``accuracy``,
``tool_error_rate`` (errors per call), ``episodes_with_tool_error``, each with ``*_se`` (over
tasks and, with several seeds, between seeds), ``by_type``, ``training`` (means over steps of
the training metrics, first-try and repaired rewards apart), ``machine`` (CPU flags and dtype
of each seed's run) and, for every arm but the baseline, ``vs_no_rollback.<measure>``
(``diff``, ``se``, ``z``, per seed); and ``negatives.png`` (held out by arm, training by step).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from statistics import fmean
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_runs import ONE_BATCH, machine, toolgrpo  # noqa: E402
from kept import (  # noqa: E402
    finder,
    keep_evals,
    keep_file,
    keep_machine,
    kept_dir,
    pin,
    step_means,
    training_steps,
    write_atomic,
)
from negatives_stats import (  # noqa: E402, F401 (Outcome, Values: read by its tests)
    Outcome,
    Values,
    measure,
    paired_pooled,
    pooled,
    read_eval,
)

CONFIG = ROOT / "configs" / "agent_smollm2_grpo.yaml"
TASK_TYPES = ("calculator", "search")
MT = "actor_rollout_ref.rollout.multi_turn."
BASELINE = "no_rollback"
ARMS: dict[str, list[str]] = {
    "no_rollback": [f"{MT}enable_tool_rollback=false"],
    "rollback_negatives": [f"{MT}enable_tool_rollback=true"],  # the defaults: retry, no cap
    "negatives_r0": [f"{MT}enable_tool_rollback=true", f"{MT}negative_reward=0"],
    "fission": [
        f"{MT}enable_tool_rollback=true",
        f"{MT}rollback_mode=fission",
        f"{MT}fission_group_size=4",
        f"{MT}max_fission_forks_per_step=8",
    ],
}
# What the arms of a directory without ``arms.json`` were run with (the first version of this
# benchmark): its ``fission`` relabelled failures (today's ``rollback_mode=relabel``).
LEGACY_ARMS: dict[str, list[str]] = {
    "no_rollback": ARMS["no_rollback"],
    "rollback_no_negatives": [f"{MT}enable_tool_rollback=true", f"{MT}save_negative_samples=false"],
    "rollback_negatives": ARMS["rollback_negatives"],
    "fission": [f"{MT}enable_tool_rollback=true", f"{MT}rollback_mode=fission"],
}
ARMS_FILE = "arms.json"
MEASURES = ("accuracy", "tool_error_rate", "episodes_with_tool_error")
TRAINING_KEYS = (
    "reward/mean",
    "reward/first_try_mean",
    "reward/repaired_mean",
    "rollback/repaired_frac",
    "episode/tool_error_rate",
    "rollout/negative_samples",
    "rollback/failed",
    "rollback/erased",
    "rollback/forks",
    "rollout/fission_rows",
    "reward/fission_mean",
    "batch/size",
    "timing/step_s",
)
STEPS = 16  # the config's total_training_steps
SEEDS = (0, 1, 2)


def pin_arms(dirs: list[Path], arms: list[str], record: bool = True) -> None:
    """Check that no directory holds runs of an arm under other overrides than ``ARMS`` gives
    it now (``SystemExit`` naming the files to move away), then (``record``) record the
    overrides of ``arms``, which are about to run there."""
    for d in dirs:
        path = d / ARMS_FILE
        recorded = json.loads(path.read_text()) if path.is_file() else dict(LEGACY_ARMS)
        for arm in ARMS:
            held = sorted(d.glob(f"eval_{arm}_seed_*.json")) + (
                [d / arm] if (d / arm).is_dir() else []
            )
            if held and recorded.get(arm, ARMS[arm]) != ARMS[arm]:
                raise SystemExit(
                    f"{d} holds {arm} runs made with {recorded.get(arm)}, not {ARMS[arm]}: move "
                    f"{', '.join(p.name for p in held)} out of {d} (or use another --work, and "
                    "another --out for the kept copies)"
                )
    for d in dirs if record else []:
        path = d / ARMS_FILE
        recorded = json.loads(path.read_text()) if path.is_file() else {}
        write_atomic(path, json.dumps({**recorded, **{a: ARMS[a] for a in arms}}, indent=1) + "\n")


def run_dir(work: Path, arm: str, seed: int) -> Path:
    return work / arm / f"seed_{seed}"


def eval_name(arm: str, seed: int) -> str:
    return f"eval_{arm}_seed_{seed}.json"


def eval_path(work: Path, arm: str, seed: int) -> Path:
    return work / eval_name(arm, seed)


def final_checkpoint(run: Path, steps: int) -> Path | None:
    ck = run / "checkpoints" / f"global_step_{steps}"
    return ck if (ck / "trainer_state.json").is_file() else None


def train_args(arm: str, seed: int, run: Path, steps: int, extra: list[str]) -> list[str]:
    """``toolgrpo train`` arguments of one arm and seed (held-out scoring comes after)."""
    return [
        "train",
        str(CONFIG),
        f"data.train_files=[{','.join(f'{t}:train' for t in TASK_TYPES)}]",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.logger=[console,jsonl]",
        ONE_BATCH,  # as these arms were run
        f"trainer.seed={seed}",
        f"trainer.output_dir={run}",
        f"trainer.rollout_data_dir={run / 'rollout_data'}",
        *ARMS[arm],
        *extra,
    ]


def eval_args(checkpoint: Path, out: Path) -> list[str]:
    files = f"data.val_files=[{','.join(f'{t}:test' for t in TASK_TYPES)}]"
    return ["eval", "--checkpoint", str(checkpoint), "--samples", "1000", "--output", str(out),
            str(CONFIG), files]  # fmt: skip


# ---- summaries (pure: read files, compute) -----------------------------------------------------


def training_summary(metrics_jsonl: Path | None) -> dict[str, float]:
    """Means over the training steps of the metrics that tell the arms apart (a key absent
    from every step, e.g. reward/repaired_mean without rollback, is left out)."""
    rows = training_steps(metrics_jsonl)
    if not rows and (metrics_jsonl is None or not metrics_jsonl.is_file()):
        return {}
    out = step_means(rows, TRAINING_KEYS)
    out["steps"] = float(len(rows))
    return out


def metrics_name(arm: str, seed: int) -> str:
    """A run's metrics.jsonl, relative to the work (and kept) directory."""
    return f"{arm}/seed_{seed}/metrics.jsonl"


def machine_name(arm: str, seed: int) -> str:
    """The machine a run trained on (CPU flags, dtype), relative to the work directory."""
    return f"{arm}/seed_{seed}/machine.json"


def keep(work: Path, kept: Path, arms: list[str], seeds: list[int], steps: int) -> None:
    """Keep every eval of ``work`` and, for every finished run, its metrics (only the keys
    ``training_summary`` reads) and the machine it trained on (``kept.keep_machine``) in
    ``kept``."""
    keep_evals(work, kept, [eval_name(arm, s) for arm in arms for s in seeds])
    for arm in arms:
        for s in seeds:
            metrics, where = work / metrics_name(arm, s), work / machine_name(arm, s)
            if final_checkpoint(run_dir(work, arm, s), steps) and metrics.is_file():
                keep_file(metrics, kept / metrics_name(arm, s), TRAINING_KEYS)
                keep_machine(where, kept / machine_name(arm, s), machine)


def summarize(
    work: Path, arms: list[str], seeds: list[int], steps: int = STEPS, kept: Path | None = None
) -> dict:
    """Every arm with at least one evaluated seed (in ``work``, or kept in ``kept``);
    differences against the baseline on the seeds both have."""
    at = finder(work, kept)
    found = {arm: {s: at(eval_name(arm, s)) for s in seeds} for arm in arms}
    evals = {
        arm: {s: read_eval(p) for s, p in by_seed.items() if p} for arm, by_seed in found.items()
    }
    evals = {arm: by_seed for arm, by_seed in evals.items() if by_seed}
    extra = at("overrides.json")
    out: dict[str, Any] = {
        "config": str(CONFIG.relative_to(ROOT)),
        "overrides": json.loads(extra.read_text()) if extra else [],
        "steps": steps,
        "seeds": seeds,
        "task_types": list(TASK_TYPES),
        "baseline": BASELINE,
        "arms": {},
    }
    for arm, by_seed in evals.items():
        rec: dict[str, Any] = {"overrides": ARMS[arm], "seeds": sorted(by_seed)}
        for m in MEASURES:
            p = pooled({s: measure(o, m) for s, o in by_seed.items()})
            rec[m], rec[f"{m}_se"], rec["tasks"] = p["value"], p["se"], p["tasks"]
        types = sorted({o.task_type for outcomes in by_seed.values() for o in outcomes.values()})
        rec["by_type"] = {}
        for t in types:
            for m in ("accuracy", "tool_error_rate"):
                p = pooled({s: measure(o, m, t) for s, o in by_seed.items()})
                rec["by_type"].setdefault(t, {}).update({m: p["value"], f"{m}_se": p["se"]})
        rec["training"] = {str(s): training_summary(at(metrics_name(arm, s))) for s in by_seed}
        where = {s: at(machine_name(arm, s)) for s in by_seed}
        rec["machine"] = {str(s): json.loads(p.read_text()) for s, p in where.items() if p}
        if arm != BASELINE and BASELINE in evals:
            base = evals[BASELINE]
            rec["vs_no_rollback"] = {
                m: paired_pooled(
                    {s: measure(o, m) for s, o in base.items()},
                    {s: measure(o, m) for s, o in by_seed.items()},
                    moved=(
                        {s: measure(o, "tool_errors") for s, o in base.items()},
                        {s: measure(o, "tool_errors") for s, o in by_seed.items()},
                    )
                    if m == "tool_error_rate"
                    else None,
                )
                for m in MEASURES
            }
        out["arms"][arm] = rec
    return out


def table(result: dict) -> str:
    """One row per arm: held-out accuracy and tool error rate, each with its paired difference
    against no rollback, and what training saw (first-try vs repaired reward)."""
    head = (f"{'arm':<22} {'accuracy':>15} {'vs no_rollback':>16} {'tool err/call':>15} "
            f"{'vs no_rollback':>16} {'repaired':>9} {'first-try r':>11}")  # fmt: skip
    lines = [head, "-" * len(head)]
    for arm, r in result["arms"].items():
        vs = r.get("vs_no_rollback", {})

        def diff(m: str, vs: dict = vs) -> str:
            return f"{100 * vs[m]['diff']:+.1f} ± {100 * vs[m]['se']:.1f}" if m in vs else "-"

        train = [t for t in r["training"].values() if t]
        rep = fmean(t.get("rollback/repaired_frac", 0.0) for t in train) if train else 0.0
        first = [t["reward/first_try_mean"] for t in train if "reward/first_try_mean" in t]
        lines.append(
            f"{arm:<22} {100 * r['accuracy']:>7.1f} ± {100 * r['accuracy_se']:<4.1f} "
            f"{diff('accuracy'):>16} {100 * r['tool_error_rate']:>7.1f} ± "
            f"{100 * r['tool_error_rate_se']:<4.1f} {diff('tool_error_rate'):>16} "
            f"{100 * rep:>8.0f}% {fmean(first) if first else float('nan'):>11.3f}"
        )
    return "\n".join(lines)


def first_try_curve(metrics_jsonl: Path | None) -> dict[int, float]:
    """A run's first-try reward by training step (``reward/mean`` where nothing was repaired)."""
    key = "reward/first_try_mean"
    return {r["step"]: float(r.get(key, r.get("reward/mean", math.nan)))
            for r in training_steps(metrics_jsonl)}  # fmt: skip


def plot(result: dict, curves: Mapping[str, list[dict[int, float]]], path: Path) -> None:
    """Held-out accuracy and tool errors per call by arm (±SE), and the first-try training
    reward by step (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(result["arms"])
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, m, title in (
        (axes[0], "accuracy", "held-out accuracy (%, ±SE)"),
        (axes[1], "tool_error_rate", "held-out tool errors per call (%, ±SE)"),
    ):
        vals = [100 * result["arms"][a][m] for a in arms]
        ses = [100 * result["arms"][a][f"{m}_se"] for a in arms]
        ax.bar(range(len(arms)), vals, yerr=ses, capsize=3, color="tab:blue")
        ax.set_xticks(range(len(arms)), [a.replace("_", "\n", 1) for a in arms], fontsize=8)
        ax.set_title(title, fontsize=9)
    for arm in arms:
        runs = [c for c in curves.get(arm, []) if c]
        steps = sorted(set.intersection(*(set(c) for c in runs))) if runs else []
        if steps:
            axes[2].plot(steps, [fmean(c[t] for c in runs) for t in steps], label=arm)
    axes[2].set_title("training reward, first tries (mean over seeds)", fontsize=9)
    axes[2].set_xlabel("step")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(result: dict, out: Path, curves: Mapping[str, list[dict[int, float]]]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    if result["arms"]:
        plot(result, curves, out.with_suffix(".png"))
    print(f"held-out calculator + search (percent; ± SE over tasks and seeds), {out}:")
    print(table(result))


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "negatives")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "negatives.json")
    ap.add_argument("--report", action="store_true", help="summarize what is there; run nothing")
    ap.add_argument("overrides", nargs="*", help="key=value for every training run (not evals)")
    args = ap.parse_args(argv)
    work, kept = args.work, kept_dir(args.out)
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    pin_arms([work, kept], args.arms, record=not args.report)
    if not args.report:
        setting = json.dumps({"overrides": args.overrides, "steps": args.steps})
        pin([work, kept], {"setting.json": setting, "overrides.json": json.dumps(args.overrides)})
        for s in args.seeds:  # seed-major: each seed's comparison lands complete
            for arm in args.arms:
                if finder(work, kept)(eval_name(arm, s)) is None:  # kept: done
                    run = run_dir(work, arm, s)
                    if final_checkpoint(run, args.steps) is None:  # resume=auto: a partial run
                        toolgrpo(*train_args(arm, s, run, args.steps, args.overrides), log=log)
                    ck = final_checkpoint(run, args.steps)
                    assert ck is not None, f"{run} has no step-{args.steps} checkpoint"
                    toolgrpo(*eval_args(ck, eval_path(work, arm, s)), log=log)
                keep(work, kept, args.arms, args.seeds, args.steps)  # an earlier session's too
                report(work, kept, args)
    report(work, kept, args)


def report(work: Path, kept: Path, args: argparse.Namespace) -> None:
    """negatives.json and negatives.png from what ``work`` and ``kept`` hold."""
    at = finder(work, kept)
    curves = {a: [first_try_curve(at(metrics_name(a, s))) for s in args.seeds] for a in args.arms}
    write(summarize(work, args.arms, args.seeds, args.steps, kept), args.out, curves)


if __name__ == "__main__":
    main(sys.argv[1:])
