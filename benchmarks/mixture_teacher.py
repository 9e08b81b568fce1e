"""Can a fixed policy teach an actor that cannot learn alone?

The actor is the base SmolLM2-135M (``smollm2-135m``: about 0 % on the environments, so its GRPO
groups are all failures and have zero advantage); the fixed policy is the agent warm start
(``smollm2-135m-agent``, about 38 %). Everything else is the agent main job
(configs/agent_smollm2_grpo.yaml: calculator + search + direct episodes, 8 tasks a step, n = 4
actor samples a task, lr 1e-4, full fine-tuning), trained ``--steps`` steps; validation during
training is off (the measurement is ``toolgrpo eval`` on all 300 held-out tasks at the end).
Every arm draws the same number of actor samples (steps × 8 × 4):

- ``actor_only``: GRPO on the actor alone.
- ``design_is``: the design's default: constant α = 0.5 per step, whole groups, fixed rows
  weighted by min(π_old/π_fixed, 2) per sequence. Half the steps are the fixed policy's, so it
  trains 2 × ``--steps`` steps to draw as many actor samples (in expectation: the coin is per
  step; ``actor_samples`` in the JSON says how many it drew).
- ``mixed_shaped``: mixed groups (every group: the actor's 4 + k = 1 fixed sample, GRPO over the
  5) and LUFFY's policy shaping of the fixed rows (γ = 0.1, r = π/π_fixed).
- ``mixed_shaped_norm`` (only with ``--arms``): ``mixed_shaped`` with ``shaping_normalize``
  (f × (1 + γ)²/γ: a fixed token the actor agrees with weighs as much as one of its own).
- ``sft_teacher``: LoRA SFT of the actor (configs/sft_smollm2_agent.yaml) on the fixed policy's
  successful episodes from the ``mixed_shaped`` run of the same seed (its rollout dumps: the very
  teacher samples that arm saw), for as many examples as that arm had fixed samples.

Each final checkpoint is scored by ``toolgrpo eval`` (300 tasks, every episode kept) and paired
by task with ``actor_only`` of the same seed (toolgrpo.eval.paired). Finished runs, SFT outputs
and evals in ``--work`` are reused, so an interrupted benchmark resumes where it stopped. What the
summary and the SFT arm need is also kept in git, in ``benchmarks/results/<out>_kept/``: each eval
(without its episodes' text), each finished run's step metrics, the SFT result, and the fixed
policy's successes of every ``mixed_shaped`` run with its fixed-sample count, all under their
``--work`` names; a later checkout reuses a kept (arm, seed) without training or evaluating it,
and ``--report`` works from the kept copies alone.

    python benchmarks/mixture_teacher.py --seeds 0 1            # all arms (hours on 2 cores)
    python benchmarks/mixture_teacher.py --seeds 0 1 --report   # only re-read what is there

Writes ``benchmarks/results/mixture_teacher.json``: ``arms``, one entry each with ``arm``,
``seeds``, ``accuracy``, ``se``, ``gain_vs_actor_only``, ``gain_se`` (points; SEs add the SE
over tasks and the SE between seeds), ``nonzero_adv_group_frac`` (mean over training steps of
1 − reward/groups_all_equal_frac), ``actor_samples``, ``fixed_samples``; ``references``: the
actor and the fixed policy before training. Each arm (and reference) also has ``behaviour``
(benchmarks/behaviour.py: answered, tool-call and tool-error shares, mean reward), so an arm
whose accuracy does not move still shows whether what it does moved.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from statistics import fmean, stdev
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from behaviour import arm_behaviour, eval_behaviour  # noqa: E402
from cli_runs import ONE_BATCH, toolgrpo  # noqa: E402
from kept import finder, keep_evals, keep_file, kept_dir, pin, write_atomic  # noqa: E402
from main_job_seeds import machine  # noqa: E402

from toolgrpo.eval.episodes import success_threshold  # noqa: E402
from toolgrpo.eval.paired import load_outcomes  # noqa: E402

CONFIG = ROOT / "configs" / "agent_smollm2_grpo.yaml"
SFT_CONFIG = ROOT / "configs" / "sft_smollm2_agent.yaml"
ACTOR = "smollm2-135m"  # the base: ~0 % on the environments
TEACHER = "smollm2-135m-agent"  # the agent warm start: ~38 %
ARMS = ("actor_only", "design_is", "mixed_shaped", "sft_teacher", "mixed_shaped_norm")
DEFAULT_ARMS = ARMS[:4]  # the four; mixed_shaped_norm on request (--arms)
STEPS = 16
SFT_BATCH = 8
REFERENCES = {"actor_start": ACTOR, "teacher": TEACHER}
RL_ARMS = ("actor_only", "design_is", "mixed_shaped", "mixed_shaped_norm")
# The metrics.jsonl keys ``step_means`` reads: all a run keeps of its metrics.
METRIC_KEYS = (
    "reward/groups_all_equal_frac",
    "batch/size",
    "rollout/using_actor",
    "rollout/using_fixed",
)


def steps_of(arm: str, steps: int) -> int:
    """An RL arm's steps: ``design_is`` doubles them (half of them are the fixed policy's)."""
    return 2 * steps if arm == "design_is" else steps


def arm_overrides(arm: str, steps: int) -> list[str]:
    """The ``toolgrpo train`` overrides of an RL arm (run and output dirs are added later)."""
    common = [
        f"actor_rollout_ref.model.path={ACTOR}",
        f"trainer.total_training_steps={steps_of(arm, steps)}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.rollout_data_samples_per_step=-1",  # every episode: the SFT arm reads them
        ONE_BATCH,  # the mixture refuses dynamic sampling
    ]
    fixed = [f"rollout_only.model_path={TEACHER}"]
    if arm == "actor_only":
        return common
    if arm == "design_is":
        return [
            *common,
            *fixed,
            "rollout_allocation_schedule.type=constant",
            "rollout_allocation_schedule.alpha=0.5",
        ]
    if arm in ("mixed_shaped", "mixed_shaped_norm"):
        norm = ["rollout_only.shaping_normalize=true"] if arm == "mixed_shaped_norm" else []
        return [
            *common,
            *fixed,
            "rollout_allocation_schedule.alpha=0.0",  # every group gets its fixed sample
            "rollout_allocation_schedule.groups=mixed",
            "rollout_allocation_schedule.fixed_per_group=1",
            "rollout_only.fixed_loss=shaped",
            "rollout_only.shaping_gamma=0.1",
            *norm,
        ]
    raise ValueError(f"{arm} is not an RL arm")


def sft_overrides(data: Path, examples: int, out: Path, seed: int) -> list[str]:
    """``toolgrpo sft`` overrides: LoRA SFT of the actor on ``data`` for ``examples`` examples
    (whole batches; the data repeats when it holds fewer)."""
    return [
        f"data.train_files=[{data}]",
        "data.max_length=2048",  # prompt 1024 + episode 1024, as in RL: nothing dropped
        f"data.train_batch_size={SFT_BATCH}",
        f"data.seed={seed}",
        f"model.path={ACTOR}",
        f"trainer.total_training_steps={max(1, math.ceil(examples / SFT_BATCH))}",
        f"trainer.output_dir={out}",
        f"trainer.seed={seed}",
    ]


def teacher_rows(dump_dir: Path) -> tuple[list[dict[str, Any]], int]:
    """SFT rows (``{"messages": ...}``) of the fixed policy's successful episodes in a run's
    rollout dumps, and how many fixed samples the run drew (rolled-back negatives left out)."""
    rows, fixed = [], 0
    for path in sorted(dump_dir.glob("*.jsonl"), key=lambda p: int(p.stem)):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if r.get("policy", "actor") == "actor" or r.get("negative"):
                continue
            fixed += 1
            reward = r.get("reward")
            if reward is not None and reward >= success_threshold(r["task_type"]):
                rows.append({"messages": r["messages"], "source": f"{r['task_id']}@{r['step']}"})
    return rows, fixed


def step_means(path: Path | None) -> dict[str, float | None]:
    """Over a run's training steps (its ``metrics.jsonl``, None: none): the share of groups
    with non-zero advantage, and the actor's and fixed policies' samples (summed)."""
    recs = [json.loads(x) for x in path.read_text().splitlines()] if path else []
    recs = [r for r in recs if "reward/groups_all_equal_frac" in r]
    if not recs:
        return {"nonzero_adv_group_frac": None, "actor_samples": None, "fixed_samples": None}
    actor = sum(r["batch/size"] * r.get("rollout/using_actor", 1.0) for r in recs)
    fixed = sum(r["batch/size"] * r.get("rollout/using_fixed", 0.0) for r in recs)
    return {
        "nonzero_adv_group_frac": fmean(1 - r["reward/groups_all_equal_frac"] for r in recs),
        "actor_samples": round(actor),
        "fixed_samples": round(fixed),
    }


def _pooled(per_task: dict[str, list[float]], per_seed: list[float], n: int) -> tuple[float, float]:
    """Mean over tasks of each task's value averaged over seeds, and its SE: the SE over tasks
    plus the SE between the seeds' means (conservative, as in main_job_seeds)."""
    means = [fmean(v) for v in per_task.values() if len(v) == n]
    m = fmean(means)
    se_tasks = stdev(means) / math.sqrt(len(means)) if len(means) > 1 else 0.0
    se_seeds = stdev(per_seed) / math.sqrt(len(per_seed)) if len(per_seed) > 1 else 0.0
    return 100 * m, 100 * math.hypot(se_tasks, se_seeds)


def eval_name(name: str) -> str:
    """The eval of a reference or of ``<arm>_seed<s>``."""
    return f"eval_{name}.json"


def summarize(work: Path, seeds: list[int], kept: Path | None = None) -> dict[str, Any]:
    """The JSON result from whatever evals and runs ``work`` holds, or ``kept`` keeps (missing
    seeds left out)."""
    at = finder(work, kept)
    found = {(arm, s): at(eval_name(f"{arm}_seed{s}")) for arm in ARMS for s in seeds}
    evals = {k: load_outcomes(path) for k, path in found.items() if path}
    arms = []
    for arm in ARMS:
        done = [s for s in seeds if (arm, s) in evals]
        if not done:
            continue
        acc_task: dict[str, list[float]] = {}
        gain_task: dict[str, list[float]] = {}
        acc_seed, gain_seed, paired_seeds = [], [], []
        for s in done:
            out = evals[(arm, s)]
            acc_seed.append(fmean(o.success for o in out.values()))
            for t, o in out.items():
                acc_task.setdefault(t, []).append(o.success)
            base = evals.get(("actor_only", s))
            if base is None:
                continue
            common = sorted(out.keys() & base.keys())
            paired_seeds.append(s)
            gain_seed.append(fmean(out[t].success - base[t].success for t in common))
            for t in common:
                gain_task.setdefault(t, []).append(out[t].success - base[t].success)
        acc, se = _pooled(acc_task, acc_seed, len(done))
        gain = gain_se = None
        if paired_seeds:
            gain, gain_se = _pooled(gain_task, gain_seed, len(paired_seeds))
        row: dict[str, Any] = {"arm": arm, "seeds": done, "accuracy": acc, "se": se}
        row |= {"gain_vs_actor_only": gain, "gain_se": gain_se, "paired_seeds": paired_seeds}
        row["behaviour"] = arm_behaviour([found[(arm, s)] for s in done])
        if arm == "sft_teacher":
            results = [at(f"{arm}_seed{s}/sft_result.json") for s in done]
            ex = [json.loads(p.read_text()).get("examples") for p in results if p]
            row |= {"nonzero_adv_group_frac": None, "sft_unique_examples": ex}
        else:
            stats = [step_means(at(f"{arm}_seed{s}/metrics.jsonl")) for s in done]
            for k in ("nonzero_adv_group_frac", "actor_samples", "fixed_samples"):
                vals = [x[k] for x in stats if x[k] is not None]
                row[k] = fmean(vals) if vals else None
        arms.append(row)
    refs = {}
    for name, model in REFERENCES.items():
        path = at(eval_name(name))
        if path:
            vals = [o.success for o in load_outcomes(path).values()]
            se = stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else 0.0
            refs[name] = {"model": model, "accuracy": 100 * fmean(vals), "se": 100 * se}
            refs[name]["behaviour"] = eval_behaviour(path)
    return {
        "config": str(CONFIG.relative_to(ROOT)),
        "actor": ACTOR,
        "fixed_policy": TEACHER,
        "arms": arms,
        "references": refs,
        "machine": machine(),
    }


# ---- running (subprocesses of the CLI; everything above is pure) ---------------------------------


def final_checkpoint(work: Path, arm: str, seed: int, steps: int) -> Path:
    return work / f"{arm}_seed{seed}" / "checkpoints" / f"global_step_{steps_of(arm, steps)}"


def teacher_names(seed: int) -> tuple[str, str]:
    """The SFT data of a seed (the fixed policy's successes in its ``mixed_shaped`` run) and
    their count file (``fixed_samples``: how many the run drew, ``successes``)."""
    return f"teacher_seed{seed}.jsonl", f"teacher_seed{seed}_count.json"


def keep_run(work: Path, kept: Path, arm: str, seed: int, steps: int) -> None:
    """Keep what a finished RL run leaves the summary and the SFT arm: its step metrics and,
    for ``mixed_shaped``, the teacher data (written from its dumps first)."""
    run = work / f"{arm}_seed{seed}"
    if not (final_checkpoint(work, arm, seed, steps) / "trainer_state.json").is_file():
        return
    if (run / "metrics.jsonl").is_file():
        keep_file(run / "metrics.jsonl", kept / run.name / "metrics.jsonl", METRIC_KEYS)
    if arm != "mixed_shaped":
        return
    data, count = (work / n for n in teacher_names(seed))
    if not (data.is_file() and count.is_file()) and (run / "rollout_data").is_dir():
        rows, fixed = teacher_rows(run / "rollout_data")
        write_atomic(data, "".join(json.dumps(r) + "\n" for r in rows))
        write_atomic(count, json.dumps({"fixed_samples": fixed, "successes": len(rows)}) + "\n")
    for path in (data, count):
        if path.is_file():
            keep_file(path, kept / path.name)


def keep_all(work: Path, kept: Path, seeds: list[int], steps: int) -> None:
    """Keep every finished piece of ``work`` (an earlier session's too) in ``kept``."""
    names = [eval_name(n) for n in REFERENCES]
    names += [eval_name(f"{arm}_seed{s}") for arm in ARMS for s in seeds]
    keep_evals(work, kept, names)
    for s in seeds:
        for arm in RL_ARMS:
            keep_run(work, kept, arm, s, steps)
        result = f"sft_teacher_seed{s}/sft_result.json"
        if (work / result).is_file():
            keep_file(work / result, kept / result)


def train(work: Path, kept: Path, arm: str, seed: int, steps: int, log: Path) -> Path:
    run = work / f"{arm}_seed{seed}"
    ck = final_checkpoint(work, arm, seed, steps)
    if not (ck / "trainer_state.json").is_file():  # resume=auto picks up a partial run
        dirs = [f"trainer.output_dir={run}", f"trainer.rollout_data_dir={run / 'rollout_data'}"]
        seed_ov = f"trainer.seed={seed}"
        toolgrpo("train", str(CONFIG), *arm_overrides(arm, steps), seed_ov, *dirs, log=log)
    keep_run(work, kept, arm, seed, steps)
    return ck


def teacher_data(work: Path, kept: Path, seed: int, steps: int, log: Path) -> tuple[Path, int]:
    """The SFT data of a seed and how many fixed samples its ``mixed_shaped`` run drew: from the
    work directory or kept, else from that run's dumps (trained first if need be)."""
    at = finder(work, kept)
    if None in (at(n) for n in teacher_names(seed)):
        train(work, kept, "mixed_shaped", seed, steps, log)  # its dumps are the data
    data, count = (at(n) for n in teacher_names(seed))
    assert data and count, f"mixed_shaped seed {seed} left no rollout dumps to learn from"
    c = json.loads(count.read_text())
    if not c["successes"]:
        raise SystemExit(f"mixed_shaped seed {seed}: the fixed policy succeeded nowhere")
    print(f"sft_teacher seed {seed}: {c['successes']} successes of {c['fixed_samples']} fixed")
    return data, c["fixed_samples"]


def sft(work: Path, kept: Path, seed: int, steps: int, log: Path) -> Path:
    out = work / f"sft_teacher_seed{seed}"
    if not (out / "sft_result.json").is_file():
        data, fixed = teacher_data(work, kept, seed, steps, log)
        toolgrpo("sft", str(SFT_CONFIG), *sft_overrides(data, fixed, out, seed), log=log)
    keep_file(out / "sft_result.json", kept / out.name / "sft_result.json")
    return out / "adapter"


def evaluate(
    work: Path, kept: Path, name: str, checkpoint: Path | None, log: Path, model: str = ""
) -> None:
    """``toolgrpo eval`` of a checkpoint (or ``model``) unless found in ``work`` or ``kept``;
    kept."""
    out = work / eval_name(name)
    if finder(work, kept)(out.name) is None:
        ck = ["--checkpoint", str(checkpoint)] if checkpoint else []
        extra = [f"actor_rollout_ref.model.path={model}"] if model else []
        toolgrpo(
            "eval", *ck, "--samples", "100", "--output", str(out), str(CONFIG), *extra, log=log
        )
    keep_evals(work, kept, [out.name])


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=ARMS)
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "mixture_teacher")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/mixture_teacher.json")
    ap.add_argument("--report", action="store_true", help="summarize what is there; run nothing")
    args = ap.parse_args(argv)
    work, kept = args.work, kept_dir(args.out)
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    if not args.report:
        pin([work, kept], {"setting.json": json.dumps({"steps": args.steps})})  # one --steps
        keep_all(work, kept, args.seeds, args.steps)  # what an earlier session finished
        for name, model in REFERENCES.items():
            evaluate(work, kept, name, None, log, model)
        for s in args.seeds:
            for arm in args.arms:
                if finder(work, kept)(eval_name(f"{arm}_seed{s}")) is None:  # kept: done
                    if arm == "sft_teacher":
                        ck = sft(work, kept, s, args.steps, log)
                    else:
                        ck = train(work, kept, arm, s, args.steps, log)
                    evaluate(work, kept, f"{arm}_seed{s}", ck, log)
                write(summarize(work, args.seeds, kept), args.out)  # each result as it lands
    write(summarize(work, args.seeds, kept), args.out)


def _fmt(v: float | None, se: float | None = None) -> str:
    if v is None:
        return "-"
    return f"{v:+.1f} ± {se:.1f}" if se is not None else f"{v:.2f}"


def write(result: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"{'arm':14} {'seeds':8} {'accuracy %':>14} {'gain vs actor_only':>20} {'nonzero adv':>12}"
    )
    for r in result["arms"]:
        acc = f"{r['accuracy']:.1f} ± {r['se']:.1f}"
        gain = _fmt(r["gain_vs_actor_only"], r["gain_se"])
        seeds = ",".join(map(str, r["seeds"]))
        print(
            f"{r['arm']:14} {seeds:8} {acc:>14} {gain:>20} {_fmt(r['nonzero_adv_group_frac']):>12}"
        )
    for name, ref in result["references"].items():
        print(f"{name} ({ref['model']}): {ref['accuracy']:.1f} ± {ref['se']:.1f} %")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
