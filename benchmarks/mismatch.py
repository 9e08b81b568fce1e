"""How far the sampler's log-probs are from the trainer's on the main job, per numerics.

Each arm builds the main job's trainer (``configs/agent_smollm2_grpo.yaml``) with its dtype and
rollout overrides, plays step 1's episodes (8 tasks × n=4, the same tasks in every arm), and
scores the sampled tokens with the trainer's own no-grad pass. The table gives the mismatch
metrics every training step logs (``toolgrpo.algos.mismatch``); the JSON also keeps the trainer's
times for a log-prob pass and for one update on that batch (comparable only when the arms ran
alone; ``--note`` records how the machine was loaded). Arms (``--arms``):

- ``vllm_bf16``: vLLM in bf16, trainer in bf16 (``dtype: auto`` on an AVX512-BF16 CPU);
- ``vllm_bf16_fp32``: vLLM in bf16, trainer in fp32;
- ``vllm_fp32``: both in fp32;
- ``hf_bf16`` / ``hf_fp32``: HF ``generate`` on the trainer's own module (KV cache vs a full
  forward: same weights, other kernels).

    python benchmarks/mismatch.py [--arms vllm_bf16 vllm_bf16_fp32 ...] [key=value ...]

Each arm runs in its own process (one vLLM engine at a time). Writes
``benchmarks/results/mismatch.{json,png}``. Run it alone: the times are only comparable then.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from cli_runs import IN_HOUSE  # noqa: E402

CONFIG = ROOT / "configs" / "agent_smollm2_grpo.yaml"
ARMS: dict[str, list[str]] = {
    "vllm_bf16": [
        "actor_rollout_ref.model.dtype=bfloat16",
        "actor_rollout_ref.rollout.dtype=bfloat16",
    ],
    "vllm_bf16_fp32": [
        "actor_rollout_ref.model.dtype=float32",
        "actor_rollout_ref.rollout.dtype=bfloat16",
    ],
    "vllm_fp32": [
        "actor_rollout_ref.model.dtype=float32",
        "actor_rollout_ref.rollout.dtype=float32",
    ],
    "hf_bf16": ["actor_rollout_ref.model.dtype=bfloat16", "actor_rollout_ref.rollout.name=hf"],
    "hf_fp32": ["actor_rollout_ref.model.dtype=float32", "actor_rollout_ref.rollout.name=hf"],
}
KEYS = (
    "rollout/logprob_diff_mean",
    "rollout/logprob_diff_max",
    "rollout/mismatch_kl",
    "rollout/mismatch_frac_outside_clip",
)


def run_arm(name: str, overrides: list[str], out: Path) -> dict:
    """In this process: one step's episodes, the trainer's log-probs of them, and timings."""
    sys.path.insert(0, str(ROOT / "src"))
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig
    from toolgrpo.trainer import rollout_correction
    from toolgrpo.trainer.trainer import Trainer

    cfg = load_config(
        TrainConfig,
        str(CONFIG),
        [
            IN_HOUSE,  # step 1's tasks as kept: the three environment types
            *ARMS[name],
            *overrides,
            f"trainer.output_dir={out}",
            "trainer.rollout_data_dir=''",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.logger=[jsonl]",
            "trainer.resume=disable",
            "trainer.overwrite_output_dir=true",
        ],
    )
    trainer = Trainer(cfg)
    try:
        t0 = time.perf_counter()
        rolled = trainer.produce(1, trainer.sampler.next_batch(), trainer.generator)
        gen_s = time.perf_counter() - t0
        batch = rolled.batch
        t0 = time.perf_counter()
        lp, _ = trainer.actor.compute_logprobs(batch)
        logprob_s = time.perf_counter() - t0
        metrics = rollout_correction.measure(cfg, lp, batch)
        batch.old_logprobs_BR, batch.old_source = lp, "trainer"
        trainer.compute_advantages(batch)
        t0 = time.perf_counter()
        trainer.actor.update(batch)
        update_s = time.perf_counter() - t0
        tokens = float(batch.response_mask_BR.sum())
        return {
            "arm": name,
            "overrides": ARMS[name] + overrides,
            "rollout_backend": type(trainer.generator).__name__,
            "trainer_dtype": str(trainer.policy.dtype).replace("torch.", ""),
            "sampled_tokens": tokens,
            "gen_s": gen_s,
            "logprob_pass_s": logprob_s,
            "update_s": update_s,
            **{k: metrics[k] for k in KEYS},
        }
    finally:
        trainer.close()


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.4))
    names = [r["arm"] for r in rows]
    a1.bar(names, [r["rollout/logprob_diff_mean"] for r in rows])
    a1.set_yscale("log")
    a1.set_title("mean |log π_trainer − log π_rollout| (nats)")
    a2.bar(names, [100 * r["rollout/mismatch_frac_outside_clip"] for r in rows])
    a2.set_title("% of sampled tokens outside PPO's clip band")
    for ax in (a1, a2):
        ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "mismatch")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "mismatch")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run this arm here
    ap.add_argument("--note", default="", help="how the machine was loaded, kept in the JSON")
    ap.add_argument("--report", action="store_true", help="re-plot the JSON; run nothing")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    if args.one:
        row = run_arm(args.one, args.overrides, args.work / args.one)
        (args.work / f"{args.one}.json").write_text(json.dumps(row, indent=1))
        return
    if args.report:
        result = json.loads(args.out.with_suffix(".json").read_text())
        if args.note:
            result["note"] = args.note
            args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        plot(result["arms"], args.out.with_suffix(".png"))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.arms:
        cmd = [sys.executable, __file__, "--one", name, "--work", str(args.work), *args.overrides]
        print("$", " ".join(cmd), flush=True)
        with (args.work / f"{name}.log").open("w") as log:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            raise SystemExit(f"arm {name} failed (rc {rc}); see {args.work / (name + '.log')}")
        rows.append(json.loads((args.work / f"{name}.json").read_text()))
        r = rows[-1]
        print(
            f"{name:>15}: diff mean {r['rollout/logprob_diff_mean']:.2e} max "
            f"{r['rollout/logprob_diff_max']:.3f} kl {r['rollout/mismatch_kl']:.2e} outside clip "
            f"{100 * r['rollout/mismatch_frac_outside_clip']:.2f} %  log-prob pass "
            f"{r['logprob_pass_s']:.1f} s, update {r['update_s']:.1f} s",
            flush=True,
        )
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cli_runs import machine

    result = {
        "config": str(CONFIG.relative_to(ROOT)),
        "arms": rows,
        "machine": machine(),
        "note": args.note,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    plot(rows, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main(sys.argv[1:])
