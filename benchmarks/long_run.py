"""The main job run longer: where GRPO on a 135M model plateaus, what more steps buy, and what
they cost the skill it does not train.

Trains ``configs/agent_smollm2_grpo_long.yaml`` (64 steps, a checkpoint every 8) with
``trainer.seed=S``, or reuses a finished run, then scores every checkpoint with ``toolgrpo eval``
on all 300 held-out calculator/search/direct tasks and, every ``--rlla-every`` steps, on
ToolRL's 80 RLLA test tasks, each paired by task with the warm start. Every checkpoint is also
paired with the main job's length (step 16), which answers "what do the extra steps buy" on the
same run. Finished pieces are reused; the evals (without their episodes' text) and the run's
metrics are kept in ``benchmarks/results/<out>_kept/`` like ``main_job_seeds.py``'s.

    python benchmarks/long_run.py                          # ~2 h on 2 cores, then ~30 min of evals
    python benchmarks/long_run.py --run outputs/agent_smollm2_grpo_long   # a run made by hand
    python benchmarks/long_run.py --report                 # only re-read what is there

Writes ``benchmarks/results/long_run.json`` (+ ``.png``): ``checkpoints`` (per step: held-out
``accuracy``, ``gain``, ``se``, ``z``, ``up``/``down``, ``by_type``, ``vs_main_job`` (gain over
step 16, paired), ``rlla_diff``/``rlla_se`` where scored); ``training`` (per step: reward, step
time, in-training validation where it ran); ``machine``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_runs import machine, toolgrpo  # noqa: E402
from kept import finder, keep_evals, keep_file, kept_dir, pin  # noqa: E402
from main_job_seeds import RLLA_CONFIG, train_run  # noqa: E402
from seed_stats import gain_fields  # noqa: E402

from toolgrpo.eval.paired import load_outcomes, load_single_turn, paired, paired_values  # noqa: E402

CONFIG = ROOT / "configs" / "agent_smollm2_grpo_long.yaml"
MAIN_JOB_STEPS = 16  # configs/agent_smollm2_grpo.yaml's length: the baseline of "more steps"
# What the training curve keeps of each step's metrics (and of each in-training validation).
STEP_KEYS = (
    "reward/mean",
    "reward/groups_all_equal_frac",
    "timing/step_s",
    "actor/entropy",
    "actor/kl_loss",
    "rollout/logprob_diff_mean",
)
VAL_KEYS = (
    "val/all/accuracy",
    "val/episode/tool_error_rate",
    "val/episode/calculator/reward/mean",
    "val/episode/search/reward/mean",
    "val/episode/direct/reward/mean",
)


def schedule(config: Path = CONFIG) -> tuple[int, int]:
    """(total_training_steps, save_freq) of the config."""
    t = yaml.safe_load(config.read_text())["trainer"]
    return int(t["total_training_steps"]), int(t["save_freq"])


def checkpoint_steps(total: int, every: int) -> list[int]:
    """The steps a run saves at: every ``every`` steps, and the last one."""
    return sorted({*range(every, total + 1, every), total})


def rlla_steps(total: int, every: int) -> list[int]:
    """The checkpoints scored on RLLA too: every ``every`` steps and the last."""
    return checkpoint_steps(total, every) if every > 0 else [total]


def checkpoint(run: Path, step: int) -> Path | None:
    ck = run / "checkpoints" / f"global_step_{step}"
    return ck if (ck / "trainer_state.json").is_file() else None


def env_name(tag: str) -> str:
    return f"eval_env_{tag}.json"


def rlla_name(tag: str) -> str:
    return f"eval_rlla_{tag}.json"


def score(work: Path, kept: Path, name: str, ck: Path | None, rlla: bool, log: Path) -> None:
    """``toolgrpo eval`` of checkpoint ``ck`` (None: the warm start) into ``work/<name>``: the
    held-out set (every episode kept) or RLLA; skipped when it is there or kept."""
    if finder(work, kept)(name) is None:
        ck_args = ["--checkpoint", str(ck)] if ck is not None else []
        samples, config = ("80", RLLA_CONFIG) if rlla else ("100", CONFIG)
        toolgrpo(
            "eval",
            *ck_args,
            "--samples",
            samples,
            "--output",
            str(work / name),
            str(config),
            log=log,
        )
    keep_evals(work, kept, [name])


def curve(metrics_jsonl: Path | None) -> list[dict]:
    """Per step of the run's metrics.jsonl: the :data:`STEP_KEYS` and :data:`VAL_KEYS` it has."""
    if metrics_jsonl is None:
        return []
    rows = [json.loads(x) for x in metrics_jsonl.read_text().splitlines() if x.strip()]
    keys = ("step", *STEP_KEYS, *VAL_KEYS)
    return [{k: r[k] for k in keys if k in r} for r in rows]


def summarize(work: Path, steps: list[int], kept: Path | None = None) -> dict:
    """The curve from the evals in ``work`` or ``kept`` (checkpoints not yet scored left out)."""
    at = finder(work, kept)
    base_env, base_rlla = at(env_name("warmstart")), at(rlla_name("warmstart"))
    assert base_env is not None, f"{work} (and {kept}) hold no warm-start eval"
    before = load_outcomes(base_env)
    rlla_before = load_single_turn(base_rlla) if base_rlla is not None else None
    main = at(env_name(f"step_{MAIN_JOB_STEPS}"))
    at_main = load_outcomes(main) if main is not None else None
    rows = []
    for step in steps:
        env = at(env_name(f"step_{step}"))
        if env is None:
            continue
        after = load_outcomes(env)
        g = gain_fields(paired(before, after, "accuracy"))
        row = {"step": step, "accuracy": g.pop("after"), **g}
        del row["before"]  # the warm start's, in ``warm_start``
        if at_main is not None and step != MAIN_JOB_STEPS:
            m = paired(at_main, after, "accuracy")["all"]
            row["vs_main_job"] = {
                "gain": 100 * m["diff"],
                "se": 100 * m["diff_se_paired"],
                "z": m["z"],
            }
        rlla = at(rlla_name(f"step_{step}"))
        if rlla is not None and rlla_before is not None:
            r = paired_values(rlla_before, load_single_turn(rlla))
            row.update(
                rlla_after=r["after"],
                rlla_diff=r["diff"],
                rlla_se=r["diff_se_paired"],
                rlla_z=r["z"],
            )
        rows.append(row)
    extra = at("overrides.json")
    return {
        "config": str(CONFIG.relative_to(ROOT)),
        "overrides": json.loads(extra.read_text()) if extra else [],
        "seed": json.loads(at("seed.json").read_text()) if at("seed.json") else None,
        "warm_start": {
            "accuracy": 100 * paired(before, before, "accuracy")["all"]["before"],
            "rlla": (sum(rlla_before.values()) / len(rlla_before)) if rlla_before else None,
        },
        "checkpoints": rows,
        "training": curve(at("metrics.jsonl")),
        "machine": machine(),
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["checkpoints"]
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(13, 3.6))
    xs = [r["step"] for r in rows]
    a1.errorbar(
        xs,
        [r["gain"] for r in rows],
        yerr=[2 * r["se"] for r in rows],
        fmt="o-",
        color="k",
        label="all (±2 paired SE)",
    )
    for t in sorted({t for r in rows for t in r["by_type"]}):
        a1.plot(xs, [r["by_type"].get(t, float("nan")) for r in rows], ".--", label=t)
    a1.axhline(0, color="grey", lw=0.8)
    a1.set(title="held-out accuracy gain over the warm start (points)", xlabel="step")
    a1.legend(fontsize=7)
    rl = [r for r in rows if "rlla_diff" in r]
    a2.errorbar(
        [r["step"] for r in rl],
        [r["rlla_diff"] for r in rl],
        yerr=[2 * r["rlla_se"] for r in rl],
        fmt="o-",
    )
    a2.axhline(0, color="grey", lw=0.8)
    a2.set(title="RLLA test reward, after − warm start (±2 SE)", xlabel="step")
    tr = [r for r in result["training"] if "reward/mean" in r]
    if tr:
        w = 8
        ys = [r["reward/mean"] for r in tr]
        smooth = [
            sum(ys[max(0, i - w + 1) : i + 1]) / len(ys[max(0, i - w + 1) : i + 1])
            for i in range(len(ys))
        ]
        a3.plot([r["step"] for r in tr], ys, ".", color="lightgrey", label="reward a step")
        a3.plot([r["step"] for r in tr], smooth, "-", label=f"mean of last {w}")
    val = [r for r in result["training"] if "val/all/accuracy" in r]
    a3.plot(
        [r["step"] for r in val],
        [r["val/all/accuracy"] for r in val],
        "s-",
        label="in-training validation accuracy",
    )
    a3.set(title="training reward and validation", xlabel="step")
    a3.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "long_run")
    ap.add_argument(
        "--run",
        type=Path,
        default=None,
        help="a finished run of the config with this seed (default WORK/seed_S)",
    )
    ap.add_argument("--rlla-every", type=int, default=16, help="score RLLA every N steps")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "long_run")
    ap.add_argument("--report", action="store_true", help="summarize what is there; run nothing")
    args = ap.parse_args(argv)
    work, kept = args.work, kept_dir(args.out)
    work.mkdir(parents=True, exist_ok=True)
    total, every = schedule()
    steps = checkpoint_steps(total, every)
    if not args.report:
        digest = hashlib.sha256(CONFIG.read_bytes()).hexdigest()
        pin(
            [work, kept],
            {
                "overrides.json": "[]",
                "config.sha256": digest + "\n",
                "seed.json": json.dumps(args.seed),
            },
        )
        log = work / "log.txt"
        run = args.run or work / f"seed_{args.seed}"
        score(work, kept, env_name("warmstart"), None, False, log)
        score(work, kept, rlla_name("warmstart"), None, True, log)
        train_run(run, CONFIG, args.seed, total, [], log)
        keep_file(run / "metrics.jsonl", kept / "metrics.jsonl", (*STEP_KEYS, *VAL_KEYS))
        for step in steps:  # the main job's length first: every later one is paired with it
            ck = checkpoint(run, step)
            if ck is None:  # a run with trainer.max_checkpoints > 0 kept only its last ones
                print(f"{run} kept no step-{step} checkpoint: its in-training validation stands")
                continue
            score(work, kept, env_name(f"step_{step}"), ck, False, log)
            if step in rlla_steps(total, args.rlla_every):
                score(work, kept, rlla_name(f"step_{step}"), ck, True, log)
            write(summarize(work, steps, kept), args.out)
    write(summarize(work, steps, kept), args.out)


def write(result: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    if result["checkpoints"]:
        plot(result, out.with_suffix(".png"))
    for r in result["checkpoints"]:
        more = r.get("vs_main_job")
        rl = f"; RLLA {r['rlla_diff']:+.3f} ± {r['rlla_se']:.3f}" if "rlla_diff" in r else ""
        vs = f"; vs step {MAIN_JOB_STEPS} {more['gain']:+.1f} ± {more['se']:.1f}" if more else ""
        print(
            f"step {r['step']}: {r['accuracy']:.1f} %, gain {r['gain']:+.1f} ± {r['se']:.1f} "
            f"(z {r['z']:.1f}){vs}{rl}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
