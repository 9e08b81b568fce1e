"""Tool rollback + negative samples on and off, from the agent warm start (issues #6, #16).

Two runs of the agent main job (configs/agent_smollm2_grpo.yaml) with the same steps and seed on
calculator + search, whose tools can fail: ``off`` plays episodes as they come; ``on`` rolls
failing tool turns back, retries them and trains on the failed attempts as negative members of
their group. Each arm's final checkpoint and the warm start are then scored by ``toolgrpo eval``
on every held-out calculator and search test task (200, greedy, no rollback), and compared
**paired by task**: accuracy and the share of episodes with a tool error, each difference with
the standard error of the per-task difference. During training the error rate counts every
call the policy made, rolled-back attempts included, so the two arms measure the same thing.

Run by hand (SmolLM2: about an hour on a 2-core CPU):
    python benchmarks/negatives.py [--steps 12] [k=v ...]
Writes benchmarks/results/negatives.json and negatives.png (or ``--results DIR``) and prints
the tables. ``key=value`` overrides apply to both runs and the evaluations.
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
from statistics import fmean
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from toolgrpo.eval.episodes import binomial_se  # noqa: E402
from toolgrpo.eval.paired import MEASURES, format_rows, load_outcomes, paired  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "agent_smollm2_grpo.yaml"
TASK_TYPES = ("calculator", "search")
MT = "actor_rollout_ref.rollout.multi_turn."
ARMS = {
    "off": [f"{MT}enable_tool_rollback=false"],
    "on": [f"{MT}enable_tool_rollback=true", f"{MT}save_negative_samples=true"],
}
KEPT_PREFIXES = ("episode/", "rollout/", "reward/mean", "batch/size", "timing/", "actor/")
CLI = [sys.executable, "-m", "toolgrpo.cli"]


def _run(cmd: list[str], log: Path) -> float:
    """Run one toolgrpo command, its output to ``log``; its wall time. A failure stops here."""
    t0 = time.time()
    with log.open("w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{tail}")
    return time.time() - t0


def run_arm(name: str, overrides: list[str], out: Path) -> tuple[list[dict[str, float]], float]:
    """One training run in its own process; its per-step metrics and wall time."""
    run_dir = [f"trainer.output_dir={out}", f"trainer.rollout_data_dir={out / 'rollout_data'}"]
    cmd = [*CLI, "train", str(CONFIG), *overrides, *ARMS[name], *run_dir]
    seconds = _run(cmd, out.parent / f"train_{name}.log")
    rows = []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("step", 0) > 0:
            kept = {k: float(v) for k, v in rec.items() if k.startswith(KEPT_PREFIXES)}
            rows.append({"step": rec["step"], **kept})
    return rows, seconds


def evaluate(label: str, checkpoint: Path | None, extra: list[str], work: Path) -> Path:
    """``toolgrpo eval`` on every calculator and search test task, every episode kept."""
    out = work / f"eval_{label}.json"
    ckpt = ["--checkpoint", str(checkpoint)] if checkpoint else []
    files = f"data.val_files=[{','.join(f'{t}:test' for t in TASK_TYPES)}]"
    cmd = [*CLI, "eval", *ckpt, "--samples", "1000", "--output", str(out), str(CONFIG), files]
    _run([*cmd, *extra], work / f"eval_{label}.log")
    return out


def eval_summary(path: Path) -> dict[str, Any]:
    """Per task type: accuracy, tool-call and tool-error rates (per call), with their SEs."""
    summary = json.loads(path.read_text())["summary"]
    out: dict[str, Any] = {}
    for t in (*TASK_TYPES, "all"):
        s = summary.get(t)
        if not s:
            continue
        calls = s["calls_per_episode"] * s["episodes"]
        err = s["tool_error_rate"]
        out[t] = {
            "accuracy": s["accuracy"],
            "accuracy_se": s["accuracy_se"],
            "tool_call_rate": s["tool_call_rate"],
            "tool_error_rate": err,
            "tool_error_rate_se": binomial_se(err, round(calls)),
            "tool_errors": s.get("tool_errors", {}),
            "episodes": s["episodes"],
        }
    return out


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


def _fmt(h: dict[str, Any], key: str) -> str:
    return f"{h[key]:.3f} ± {h[key + '_se']:.3f}" if h else "-"


def comparisons(evals: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Paired differences (after − before) by task: each arm vs the warm start, on vs off."""
    outcomes = {k: load_outcomes(v) for k, v in evals.items()}
    pairs = {"off - warm_start": ("warm_start", "off"), "on - warm_start": ("warm_start", "on")}
    pairs["on - off"] = ("off", "on")
    return {
        name: {m: paired(outcomes[a], outcomes[b], m) for m in MEASURES}
        for name, (a, b) in pairs.items()
    }


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--work", type=Path, default=None, help="run directories (default: a tmp dir)")
    args, extra = ap.parse_known_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="toolgrpo_negatives_"))
    work.mkdir(parents=True, exist_ok=True)
    overrides = [
        f"data.train_files=[{','.join(f'{t}:train' for t in TASK_TYPES)}]",
        f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=false",  # held-out scoring is done by toolgrpo eval afterwards
        "trainer.test_freq=-1",
        f"trainer.seed={args.seed}",
        f"data.seed={args.seed}",
        "trainer.logger=[jsonl]",
        "trainer.save_freq=-1",  # the final checkpoint only
        "trainer.save_hf_model=false",
        "trainer.resume=disable",
        "trainer.overwrite_output_dir=true",  # a re-run replaces (moves aside) the last one
        *extra,
    ]
    runs, summary = {}, {}
    for arm in ARMS:
        rows, seconds = run_arm(arm, overrides, work / arm)
        runs[arm], summary[arm] = rows, summarize(rows, seconds)
        print(f"{arm}: {len(rows)} steps in {seconds:.0f} s", flush=True)
    evals = {"warm_start": evaluate("warm_start", None, extra, work)}
    for arm in ARMS:
        ckpt = work / arm / "checkpoints" / f"global_step_{args.steps}"
        evals[arm] = evaluate(arm, ckpt, extra, work)
    for name, path in evals.items():
        summary.setdefault(name, {})["held_out"] = eval_summary(path)
    paired_results = comparisons(evals)
    args.results.mkdir(parents=True, exist_ok=True)
    record = {
        "config": str(CONFIG.relative_to(ROOT)),
        "overrides": overrides,
        "arms": {k: v for k, v in ARMS.items()},
        "cpu_flags": cpu_flags(),
        "load_average_at_end": os.getloadavg(),
        "summary": summary,
        "paired": paired_results,
        "steps": runs,
    }
    (args.results / "negatives.json").write_text(json.dumps(record, indent=1))
    plot(runs, args.results / "negatives.png")
    t = Table(
        title=f"Held-out (greedy, toolgrpo eval) after {args.steps} steps, negatives on vs off"
    )
    for c in ("policy", *(f"{ty} {m}" for ty in TASK_TYPES for m in ("accuracy", "tool errors"))):
        t.add_column(c)
    for name in ("warm_start", *ARMS):
        h = summary[name]["held_out"]
        cells = []
        for ty in TASK_TYPES:
            cells += [_fmt(h.get(ty, {}), "accuracy"), _fmt(h.get(ty, {}), "tool_error_rate")]
        t.add_row(name if name == "warm_start" else f"negatives {name}", *cells)
    Console(width=150).print(t)
    for name, by_measure in paired_results.items():
        for measure, result in by_measure.items():
            print(f"paired {name}, {measure}:")
            print("\n".join(format_rows(result)))
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
