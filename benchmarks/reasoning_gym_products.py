"""Does the main job learn on procedural tasks nobody here wrote?

reasoning-gym's ``products`` dataset (two factors of up to ``--max-digits`` digits; the
dataset's own verifier scores the ``<answer>``), played as multi-turn episodes with the
calculator available (``reasoning_gym:<dataset>`` task source, ``envs/reasoning_gym.py``).
The agent warm start (``configs/agent_smollm2_grpo.yaml``: SmolLM2-135M agent, LoRA, KL anchor)
trains ``--steps`` GRPO steps on the train split (seeded: reasoning-gym's seed 2S), and the warm
start and the final checkpoint are scored with ``toolgrpo eval`` on ``--tasks`` held-out tasks
(the test split: seed 2S + 1, so no item is shared), paired by task (toolgrpo.eval.paired).

    python benchmarks/reasoning_gym_products.py [--steps 16] [--tasks 100] [--seed 0]

Finished runs and evals in ``--work`` are reused. Writes
``benchmarks/results/reasoning_gym_products.json``: ``before`` / ``after`` (accuracy, %),
``gain`` / ``gain_se`` / ``z`` (points, paired), ``episodes_with_tool_error``, ``machine``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cli_runs import machine, toolgrpo  # noqa: E402

from toolgrpo.eval.paired import load_outcomes, paired  # noqa: E402

CONFIG = ROOT / "configs" / "agent_smollm2_grpo.yaml"


def sources(args: argparse.Namespace) -> tuple[str, str]:
    """The train and held-out task sources."""
    q = f"max_digits={args.max_digits}"
    return (
        f"reasoning_gym:products:train?size=800&{q}",
        f"reasoning_gym:products:test?size={args.tasks}&{q}",
    )


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--tasks", type=int, default=100, help="held-out tasks")
    ap.add_argument("--max-digits", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "reasoning_gym_products")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    log = args.work / "log.txt"
    train, test = sources(args)
    common = [str(CONFIG), f"data.val_files=[{test}]", f"trainer.seed={args.seed}"]
    t0 = time.time()

    def evaluate(name: str, checkpoint: Path | None) -> Path:
        out = args.work / f"eval_{name}.json"
        if not out.is_file():
            ck = ["--checkpoint", str(checkpoint)] if checkpoint else []
            keep = ["--samples", str(args.tasks * 4)]  # every episode kept
            toolgrpo("eval", *ck, *keep, "--output", str(out), *common, log=log)
        return out

    before = evaluate("warmstart", None)
    run = args.work / f"seed_{args.seed}"
    final = run / "checkpoints" / f"global_step_{args.steps}"
    if not (final / "trainer_state.json").is_file():
        toolgrpo(
            "train",
            *common,
            f"data.train_files=[{train}]",
            f"trainer.total_training_steps={args.steps}",
            "trainer.test_freq=0",
            "trainer.val_before_train=false",
            f"trainer.save_freq={args.steps}",
            f"trainer.output_dir={run}",
            log=log,
        )
    after = evaluate(f"seed_{args.seed}", final)
    a, b = load_outcomes(before), load_outcomes(after)
    acc = paired(a, b, "accuracy")["all"]
    err = paired(a, b, "episodes_with_tool_error")["all"]
    result = {
        "what": "reasoning-gym products with the calculator: the agent warm start before and "
        f"after {args.steps} GRPO steps of the main job's settings, {args.tasks} held-out tasks",
        "train": train,
        "held_out": test,
        "tasks": acc["tasks"],
        "steps": args.steps,
        "seed": args.seed,
        "before": 100 * acc["before"],
        "after": 100 * acc["after"],
        "gain": 100 * acc["diff"],
        "gain_se": 100 * acc["diff_se_paired"],
        "z": acc["z"],
        "up": acc["up"],
        "down": acc["down"],
        "episodes_with_tool_error": {"before": 100 * err["before"], "after": 100 * err["after"]},
        "seconds": round(time.time() - t0),
        "machine": machine(),
        "command": "python benchmarks/reasoning_gym_products.py " + " ".join(argv),
    }
    out = args.results / "reasoning_gym_products.json"
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("before", "after", "gain", "gain_se", "z")}))


if __name__ == "__main__":
    main(sys.argv[1:])
