"""The README's main job over several seeds: does it learn on every seed, by how much, and at
what cost to a skill it does not train?

For each seed, ``toolgrpo train configs/agent_smollm2_grpo.yaml trainer.seed=S`` (nothing else
changed; the task order follows the seed), then the final checkpoint is scored with
``toolgrpo eval`` on all 300 held-out calculator/search/direct tasks and on ToolRL's 80 RLLA
test tasks (single-turn, another format: the forgetting check), each paired by task with the
warm start. Finished pieces are reused, so an interrupted run resumes where it stopped; one
``--work`` holds one setting: the hash of the config file as the overrides leave it
(``setting.sha256``) is checked, so a value in the file or on the command line is the same
setting; the overrides the runs were trained with are in ``overrides.json``. Each eval (without
its episodes' text) and those files are also kept in git, in ``benchmarks/results/<out>_kept/``:
a later checkout reuses a kept seed without training or evaluating it again, and ``--report``
works from the kept copies alone.

    python benchmarks/main_job_seeds.py                          # seeds 0-4, ~1 h a seed
    python benchmarks/main_job_seeds.py --seeds 0 1 2 --report   # only re-read what is there
    python benchmarks/main_job_seeds.py --config configs/agent_gemma3_grpo.yaml \
        --work outputs/main_job_gemma3 --out benchmarks/results/main_job_gemma3  # another model

With ``--config`` the same job runs from another main-job config (another model): its steps are
the config's ``trainer.total_training_steps``, and the RLLA eval scores that config's model.
``--evals env`` (or any of ``env rlla schemas``) runs only those evals; the summary reports the
evals it finds (a seed needs its held-out env eval; the RLLA and unseen-tools fields are left out
of a seed without them).

The record is five seeds (0-4). Seeds 0-2 pooled left the held-out gain at z 3.5; seeds 3 and 4
were added to estimate the spread between seeds, decided before either ran, and the five-seed
pool is the record whatever it shows (the first three's pool stays in the docs beside it).

Writes ``benchmarks/results/main_job_seeds.json`` (+ ``.png``): per seed ``seed``, ``gain``,
``se``, ``z`` (held-out accuracy, points), ``rlla_before``, ``rlla_after``, ``rlla_diff``,
``rlla_se`` (mean RLLA reward, paired), the unseen-tools fields (``schemas_*``), ``training``
(means over the steps, and ``peak_rss_gb``); ``warm_start_accuracy``; ``pooled.gain`` /
``pooled.se`` (the mean gain over seeds and tasks; its SE is the crossed tasks x seeds
random-effects SE, and ``pooled.se_conservative`` adds the SE over tasks and the SE between
seeds); ``pooled_first_three`` (the same held-out fields over the first three seeds given, when
there are more); ``machine`` (where the summary was written) and, per seed, ``machine`` (where
its run trained, where that was recorded: seeds 0-3 of the record predate it).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_runs import machine, toolgrpo  # noqa: E402
from kept import (  # noqa: E402
    finder,
    keep_evals,
    keep_file,
    keep_machine,
    kept_dir,
    pin_setting,
    step_means,
    write_atomic,
)
from seed_stats import (  # noqa: E402
    gain_fields,
    pooled_gain,
    pooled_rlla,
    rlla_fields,
)
from unseen_tools import SCHEMA_MEASURES, SCHEMAS, pooled_schemas, schema_fields  # noqa: E402

from toolgrpo.eval.paired import (  # noqa: E402
    load_outcomes,
    load_single_turn,
    paired,
    paired_values,
)

CONFIG = ROOT / "configs" / "agent_smollm2_grpo.yaml"
RLLA_CONFIG = ROOT / "configs" / "grpo_smollm2_rlla.yaml"
STEPS = 16  # the default config's trainer.total_training_steps
FIRST = 3  # the seeds of the record before it grew to five: their pool is kept beside the five's
# What each seed's summary averages over its training steps (time, the sampler/trainer mismatch,
# reward); kept in git with the in-training validation accuracy.
TRAINING_KEYS = (
    "timing/step_s",
    "timing/gen_s",
    "timing/train_s",
    "reward/mean",
    "rollout/logprob_diff_mean",
    "rollout/logprob_diff_max",
    "rollout/mismatch_kl",
    "rollout/mismatch_frac_outside_clip",
    "rollout/is_weight_truncated_frac",
    "perf/rss_gb",
)
PEAK_KEY = "perf/peak_rss_gb"  # its largest value is the run's (an upper bound: trainer/perf.py)
VAL_KEY = "val/all/accuracy"


@dataclass(frozen=True)
class Job:
    """The main-job config every seed trains (and the env and unseen-tools evals read), its
    number of steps (the final checkpoint's), and the overrides that make the RLLA eval score
    its model (none for the default config, whose model the RLLA config already names)."""

    config: Path = CONFIG
    steps: int = STEPS
    rlla: tuple[str, ...] = ()

    @classmethod
    def of(cls, config: Path) -> Job:
        from omegaconf import OmegaConf

        config = config.resolve()
        cfg = OmegaConf.load(config)
        rlla: tuple[str, ...] = ()
        if config != CONFIG:
            model = cfg.actor_rollout_ref.model
            rlla = (f"actor_rollout_ref.model.path={model.path}",)
            if model.get("adapter_path"):
                rlla += (f"actor_rollout_ref.model.adapter_path={model.adapter_path}",)
        return cls(config, int(cfg.trainer.total_training_steps), rlla)

    def rlla_model(self) -> list[str]:
        return list(self.rlla)

    def label(self) -> str:
        inside = self.config.is_relative_to(ROOT)
        return str(self.config.relative_to(ROOT) if inside else self.config)


def final_checkpoint(run: Path, job: Job = Job()) -> Path | None:
    ck = run / "checkpoints" / f"global_step_{job.steps}"
    return ck if (ck / "trainer_state.json").is_file() else None


def eval_names(name: str) -> tuple[str, str, str]:
    """The held-out env eval, the RLLA eval and the unseen-tools eval of ``warmstart`` or
    ``seed_<s>``."""
    return f"eval_env_{name}.json", f"eval_rlla_{name}.json", f"eval_schemas_{name}.json"


EVALS = ("env", "rlla", "schemas")  # eval_names' order


def evaluated(work: Path, kept: Path | None, name: str, evals: tuple[str, ...] = EVALS) -> bool:
    """The ``evals`` of ``name`` are there, in the work directory or kept."""
    at = finder(work, kept)
    names = zip(EVALS, eval_names(name), strict=True)
    return all(at(n) is not None for e, n in names if e in evals)


def evaluate(
    work: Path,
    kept: Path,
    name: str,
    checkpoint: Path | None,
    log: Path,
    job: Job = Job(),
    evals: tuple[str, ...] = EVALS,
) -> None:
    """Held-out env eval (300 tasks, every episode kept), RLLA test eval (80 tasks) and the
    unseen-tools eval (480), those of ``evals`` each run unless found in ``work`` or ``kept``,
    and kept."""
    ck = ["--checkpoint", str(checkpoint)] if checkpoint else []
    env, rlla, schemas = eval_names(name)
    runs = (
        (env, "100", [str(job.config)]),
        (rlla, "80", [str(RLLA_CONFIG), *job.rlla_model()]),
        (schemas, "240", [str(job.config), f"data.val_files=[{SCHEMAS}]"]),
    )
    for kind, (rel, samples, config) in zip(EVALS, runs, strict=True):
        if kind in evals and finder(work, kept)(rel) is None:
            out = str(work / rel)
            toolgrpo("eval", *ck, "--samples", samples, "--output", out, *config, log=log)
    keep_evals(work, kept, (env, rlla, schemas))


def train_run(run: Path, config: Path, seed: int, steps: int, extra: list[str], log: Path) -> Path:
    """``toolgrpo train config`` with ``seed`` into ``run`` unless its step-``steps``
    checkpoint is there (``resume: auto`` picks up a partial run); that checkpoint."""
    ck = run / "checkpoints" / f"global_step_{steps}"
    if not (ck / "trainer_state.json").is_file():
        toolgrpo(
            "train",
            str(config),
            f"trainer.seed={seed}",
            f"trainer.output_dir={run}",
            f"trainer.rollout_data_dir={run / 'rollout_data'}",
            *extra,
            log=log,
        )
    assert (ck / "trainer_state.json").is_file(), f"{run} has no step-{steps} checkpoint"
    return ck


def run_seed(work: Path, seed: int, extra: list[str], log: Path, job: Job = Job()) -> Path:
    return train_run(work / f"seed_{seed}", job.config, seed, job.steps, extra, log)


def metrics_name(seed: int) -> str:
    return f"seed_{seed}/metrics.jsonl"


def machine_name(seed: int) -> str:
    """The machine a seed's run trained on (CPU flags, dtype, cores), beside its metrics."""
    return f"seed_{seed}/machine.json"


def keep_metrics(work: Path, kept: Path, seed: int, job: Job = Job()) -> None:
    """Keep a finished run's metrics.jsonl (only the keys its summary reads) and the machine it
    trained on (``kept.keep_machine``)."""
    src, where = work / metrics_name(seed), work / machine_name(seed)
    if final_checkpoint(work / f"seed_{seed}", job) is not None and src.is_file():
        keep_file(src, kept / metrics_name(seed), (*TRAINING_KEYS, PEAK_KEY, VAL_KEY))
        keep_machine(where, kept / machine_name(seed), machine)


def training(metrics_jsonl: Path | None) -> dict:
    """Means over a run's training steps of :data:`TRAINING_KEYS`, and its in-training
    validation accuracy by step (empty when the run's metrics are not at hand)."""
    if metrics_jsonl is None:
        return {}
    every = [json.loads(line) for line in metrics_jsonl.read_text().splitlines() if line.strip()]
    steps = [r for r in every if r.get("step", 0) > 0]
    out: dict = step_means(steps, TRAINING_KEYS)
    peaks = [float(r[PEAK_KEY]) for r in steps if PEAK_KEY in r]
    if peaks:
        out["peak_rss_gb"] = max(peaks)
    out["val_accuracy"] = {str(r["step"]): r[VAL_KEY] for r in every if VAL_KEY in r}
    return out


def summarize(work: Path, seeds: list[int], kept: Path | None = None, job: Job = Job()) -> dict:
    """The result from the evals in ``work``, or kept in ``kept`` (seeds without both evals
    left out)."""
    at = finder(work, kept)
    base_env, base_rlla, base_schemas = (at(n) for n in eval_names("warmstart"))
    assert base_env, f"{work} (and {kept}) hold no warm-start env eval"
    before = load_outcomes(base_env)
    rlla_before = load_single_turn(base_rlla) if base_rlla else None
    rows, per_task = [], {}
    schema_cells: dict[str, dict[str, list[float]]] = {m: {} for m in SCHEMA_MEASURES}
    for s in seeds:
        env, rlla, schemas = (at(n) for n in eval_names(f"seed_{s}"))
        if env is None:  # not evaluated yet
            continue
        after = load_outcomes(env)
        p = paired(before, after, "accuracy")
        rows.append(
            {
                "seed": s,
                **gain_fields(p),
                **(
                    rlla_fields(paired_values(rlla_before, load_single_turn(rlla)))
                    if rlla_before and rlla
                    else {}
                ),
                **(
                    schema_fields(base_schemas, schemas, schema_cells)
                    if base_schemas and schemas
                    else {}
                ),
                "training": training(at(metrics_name(s))),
            }
        )
        if (where := at(machine_name(s))) is not None:  # runs kept before it have no record
            rows[-1]["machine"] = json.loads(where.read_text())
        for t in before.keys() & after.keys():
            per_task.setdefault(t, []).append(after[t].success - before[t].success)
    extra = at("overrides.json")  # what every training run of this --work added
    out: dict = {
        "config": job.label(),
        "overrides": json.loads(extra.read_text()) if extra else [],
        "steps": job.steps,
        "warm_start_accuracy": 100 * fmean(o.success for o in before.values()),
        "seeds": rows,
    }
    if rows:
        out["pooled"] = {
            **pooled_gain(rows, per_task),
            **pooled_rlla([r["rlla_diff"] for r in rows if "rlla_diff" in r]),
            **pooled_schemas([r for r in rows if "schemas_diff" in r], schema_cells),
        }
    if len(rows) > FIRST:  # the record before seeds were added to it (the module's docstring)
        first = {t: v[:FIRST] for t, v in per_task.items() if len(v) == len(rows)}
        out["pooled_first_three"] = pooled_gain(rows[:FIRST], first)
    out["machine"] = machine()
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["seeds"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.4))
    xs = [str(r["seed"]) for r in rows]
    a1.errorbar(xs, [r["gain"] for r in rows], yerr=[2 * r["se"] for r in rows], fmt="o")
    if "pooled" in result:
        p = result["pooled"]
        a1.errorbar(["pooled"], [p["gain"]], yerr=[2 * p["se"]], fmt="s", color="k")
    a1.axhline(0, color="grey", lw=0.8)
    a1.set_title("held-out accuracy gain (points, ±2 paired SE)")
    a1.set_xlabel("seed")
    with_rlla = [r for r in rows if "rlla_diff" in r]
    a2.errorbar(
        [str(r["seed"]) for r in with_rlla],
        [r["rlla_diff"] for r in with_rlla],
        yerr=[2 * r["rlla_se"] for r in with_rlla],
        fmt="o",
    )
    a2.axhline(0, color="grey", lw=0.8)
    a2.set_title("RLLA test reward, after − before (±2 SE)")
    a2.set_xlabel("seed")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--config", type=Path, default=CONFIG, help="the main-job config to train")
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "main_job_seeds")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "main_job_seeds")
    ap.add_argument("--report", action="store_true", help="summarize what is there; run nothing")
    ap.add_argument(
        "--evals",
        nargs="+",
        choices=EVALS,
        default=list(EVALS),
        help="the evals to run (held-out env, RLLA forgetting check, unseen tools); the summary "
        "reports those found",
    )
    ap.add_argument("overrides", nargs="*", help="key=value for every training run (not evals)")
    args = ap.parse_args(argv)
    work, kept, job = args.work, kept_dir(args.out), Job.of(args.config)
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    if not args.report:
        # The config file as the overrides leave it, by its hash (the file can change between
        # invocations: a new default): runs (and kept evals) of another setting are not reused.
        pin_setting([work, kept], job.config, args.overrides)
        evals = tuple(args.evals)
        evaluate(work, kept, "warmstart", None, log, job, evals)
        for s in args.seeds:
            if not evaluated(work, kept, f"seed_{s}", evals):  # a kept seed is done
                ck = run_seed(work, s, args.overrides, log, job)
                evaluate(work, kept, f"seed_{s}", ck, log, job, evals)
            keep_evals(work, kept, eval_names(f"seed_{s}"))  # evals of an earlier session too
            keep_metrics(work, kept, s, job)
            write(summarize(work, args.seeds, kept, job), args.out)  # each seed as it lands
    write(summarize(work, args.seeds, kept, job), args.out)


def write(result: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out.with_suffix(".json"), json.dumps(result, indent=1) + "\n")
    if result["seeds"]:
        plot(result, out.with_suffix(".png"))
    for r in result["seeds"]:
        rlla = (
            f"; RLLA reward {r['rlla_before']:.3f} -> {r['rlla_after']:.3f} "
            f"({r['rlla_diff']:+.3f} ± {r['rlla_se']:.3f})"
            if "rlla_diff" in r
            else ""
        )
        print(
            f"seed {r['seed']}: {r['before']:.1f} -> {r['after']:.1f} %, gain {r['gain']:+.1f} "
            f"± {r['se']:.1f} (z {r['z']:.1f})"
            + rlla
            + "; unseen tools "
            + ", ".join(
                f"{m} {r['schemas_before'][m]:.1f} -> {r['schemas_after'][m]:.1f} %"
                for m in SCHEMA_MEASURES
                if "schemas_before" in r
            )
        )
    if "pooled" in result:
        p = result["pooled"]
        print(f"pooled over {p['seeds']} seeds: {p['gain']:+.1f} ± {p['se']:.1f} (z {p['z']:.1f})")


if __name__ == "__main__":
    main(sys.argv[1:])
