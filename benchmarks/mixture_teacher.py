"""Can a fixed policy teach an actor that cannot learn alone?

The base SmolLM2-135M (about 0 % on the environments) trains with the agent warm start (about
38 %) as fixed policy, in each of the arms ``mixture_teacher_arms`` defines (the agent main job,
16 steps, 8 tasks × 4 actor samples a step, validation off), and SFT on the teacher's successes as
the arm to beat. Each final checkpoint is measured twice on all 300 held-out tasks with
``toolgrpo eval``: greedy accuracy and pass@4 at T = 1 (``mixture_teacher_summary``), and paired
by task with ``actor_only`` of the same seed.

Finished runs, SFT outputs and evals in ``--work`` are reused, so an interrupted benchmark resumes
where it stopped. What the summary and the SFT arm need is also kept in git, in
``benchmarks/results/<out>_kept/``: each eval (without its episodes' text), each finished run's
step metrics (``METRIC_KEYS``: what every arm needs to explain itself), the SFT result, and the
fixed policy's successes of every ``mixed_shaped`` run with its fixed-sample count, under their
``--work`` names; ``--report`` works from the kept copies alone. An (arm, seed) is done when both
its evals are found; one with a kept greedy eval but no pass@4 and no run in ``--work`` is trained
again and both measures are taken anew (they then describe one checkpoint; the kept greedy eval
is replaced). A run in ``--work`` is measured by its own evals only.

    python benchmarks/mixture_teacher.py --seeds 0 1            # the default arms (see below)
    python benchmarks/mixture_teacher.py --seeds 0 1 --report   # only re-read what is there

Default arms: ``actor_only``, ``shaped_norm_seq``, ``shaped_split``, ``guided`` (the recipe,
configs/mixture_teacher.yaml) and ``sft_teacher``; ``--arms`` picks others (``design_is``,
``mixed_shaped``, ``mixed_shaped_norm``). On 2 AVX512-BF16 cores: about 15 min to train
``actor_only``, 40 min each mixed arm, 10 min SFT, 2-3 min a greedy eval and 10 min a pass@4
eval, so about 3.5 h a seed and 7-8 h for seeds 0 and 1.

Writes ``benchmarks/results/mixture_teacher.json``: ``arms``, one entry each with ``arm``,
``seeds``, ``accuracy``, ``se``, ``gain_vs_actor_only``, ``gain_se`` (points; SEs add the SE over
tasks and the SE between seeds), ``pass_at_4``, ``pass_at_4_se``, ``pass_at_4_gain_vs_actor_only``,
``pass_at_4_gain_se``, the same gains against ``sft_teacher`` (``gain_vs_sft_teacher``,
``pass_at_4_gain_vs_sft_teacher`` and their SEs, on the seeds both have), ``fixed_grad_share``
(the fixed rows' share of the update's gradient weight, mean over steps; 0 and 1 by construction
for ``actor_only`` and ``sft_teacher``),
``step_metrics`` (mean and median over steps of each explaining metric), ``nonzero_adv_group_frac``,
``actor_samples``, ``fixed_samples`` and ``behaviour`` (benchmarks/behaviour.py); ``references``:
the actor and the fixed policy before training.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cli_runs import toolgrpo  # noqa: E402
from kept import finder, keep_evals, keep_file, kept_dir, pin, write_atomic  # noqa: E402
from mixture_teacher_arms import (  # noqa: E402, F401 (the arms, re-exported for callers)
    ACTOR,
    ARMS,
    CONFIG,
    DEFAULT_ARMS,
    NEW_ARMS,
    RECIPE,
    RECIPE_OVERRIDES,
    REFERENCES,
    RL_ARMS,
    SFT_CONFIG,
    STEPS,
    TEACHER,
    arm_overrides,
    config_of,
    sft_overrides,
    steps_of,
    teacher_rows,
)
from mixture_teacher_summary import (  # noqa: E402, F401
    METRIC_KEYS,
    eval_name,
    pass_at_k,
    step_stats,
    summarize,
    write,
)

MEASURES = ("greedy", "pass4")
# toolgrpo eval's options and overrides per measure: every episode kept (100 tasks a type, 4
# episodes a task with pass4, sampled at T = 1 under the run's seed)
EVAL_OPTIONS = {"greedy": ["--samples", "100"], "pass4": ["--samples", "400"]}
PASS4 = [
    "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
    "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    "actor_rollout_ref.rollout.val_kwargs.n=4",
]


def eval_args(measure: str, out: Path, seed: int) -> list[str]:
    """``toolgrpo eval``'s arguments after the checkpoint: options, the config, overrides."""
    over = [*PASS4, f"trainer.seed={seed}"] if measure == "pass4" else []
    return [*EVAL_OPTIONS[measure], "--output", str(out), str(CONFIG), *over]


def final_checkpoint(work: Path, arm: str, seed: int, steps: int) -> Path:
    return work / f"{arm}_seed{seed}" / "checkpoints" / f"global_step_{steps_of(arm, steps)}"


def finished(work: Path, arm: str, seed: int, steps: int) -> Path | None:
    """What ``toolgrpo eval`` loads of an (arm, seed) finished in ``work``, else None."""
    if arm == "sft_teacher":
        out = work / f"sft_teacher_seed{seed}"
        return out / "adapter" if (out / "sft_result.json").is_file() else None
    ck = final_checkpoint(work, arm, seed, steps)
    return ck if (ck / "trainer_state.json").is_file() else None


def teacher_names(seed: int) -> tuple[str, str]:
    """The SFT data of a seed (the fixed policy's successes in its ``mixed_shaped`` run) and
    their count file (``fixed_samples``: how many the run drew, ``successes``)."""
    return f"teacher_seed{seed}.jsonl", f"teacher_seed{seed}_count.json"


def keep_run(work: Path, kept: Path, arm: str, seed: int, steps: int) -> None:
    """Keep what a finished RL run leaves the summary and the SFT arm: its step metrics and,
    for ``mixed_shaped``, the teacher data (written from its dumps first)."""
    run = work / f"{arm}_seed{seed}"
    if finished(work, arm, seed, steps) is None:
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
    names = [eval_name(n, m) for n in REFERENCES for m in MEASURES]
    names += [eval_name(f"{arm}_seed{s}", m) for arm in ARMS for s in seeds for m in MEASURES]
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
        over = [*arm_overrides(arm, steps), f"trainer.seed={seed}", *dirs]
        toolgrpo("train", str(config_of(arm)), *over, log=log)
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
    work: Path,
    kept: Path,
    name: str,
    checkpoint: Path | None,
    log: Path,
    model: str = "",
    measure: str = "greedy",
    seed: int = 0,
    reuse_kept: bool = True,
) -> None:
    """``toolgrpo eval`` of a checkpoint (or ``model``) for one measure, unless found in ``work``
    (or kept, with ``reuse_kept``: not for a run in ``work``, measured by its own evals); kept."""
    out = work / eval_name(name, measure)
    if finder(work, kept if reuse_kept else None)(out.name) is None:
        ck = ["--checkpoint", str(checkpoint)] if checkpoint else []
        extra = [f"actor_rollout_ref.model.path={model}"] if model else []
        toolgrpo("eval", *ck, *eval_args(measure, out, seed), *extra, log=log)
    keep_evals(work, kept, [out.name])


def run_arm(work: Path, kept: Path, arm: str, seed: int, steps: int, log: Path) -> None:
    """Both measures of one (arm, seed): reused when found, else taken of the run in ``work``,
    else of a run trained (again) now."""
    name = f"{arm}_seed{seed}"
    ran = finished(work, arm, seed, steps)
    if ran is None and all(finder(work, kept)(eval_name(name, m)) for m in MEASURES):
        return  # done, kept
    if ran is None:  # train: both measures then describe this checkpoint
        if arm == "sft_teacher":
            ran = sft(work, kept, seed, steps, log)
        else:
            ran = train(work, kept, arm, seed, steps, log)
    for m in MEASURES:
        evaluate(work, kept, name, ran, log, measure=m, seed=seed, reuse_kept=False)


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
            for m in MEASURES:
                evaluate(work, kept, name, None, log, model, m)
        for s in args.seeds:
            for arm in args.arms:
                run_arm(work, kept, arm, s, args.steps, log)
                write(summarize(work, args.seeds, kept), args.out)  # each result as it lands
    write(summarize(work, args.seeds, kept), args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
