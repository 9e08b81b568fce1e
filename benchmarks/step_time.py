"""GRPO step time on SmolLM2-135M: generation / log-prob / update split, tokens/s, peak RSS.

Run by hand (minutes on a 2-core CPU):  python benchmarks/step_time.py [key=value ...]
Writes benchmarks/results/step_time.json and prints one table.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from toolgrpo.config.loader import load_config  # noqa: E402
from toolgrpo.config.schema import TrainConfig  # noqa: E402
from toolgrpo.trainer.trainer import Trainer  # noqa: E402

DEFAULTS = [
    "actor_rollout_ref.model.path=smollm2-135m-toolrl",
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=4",
    "data.max_prompt_length=1024",
    "data.max_response_length=160",
    "trainer.total_training_steps=4",
    "trainer.logger=[jsonl]",
    "trainer.save_freq=-1",
]


def main(argv: list[str]) -> None:
    steps_to_skip = 1  # the first step pays one-off costs (allocator warm-up)
    out_dir = tempfile.mkdtemp(prefix="toolgrpo_bench_")
    cfg = load_config(TrainConfig, None, [*DEFAULTS, f"trainer.output_dir={out_dir}", *argv])
    trainer = Trainer(cfg)
    rows = []
    for step in range(1, cfg.trainer.total_training_steps + 1):
        rows.append(trainer.train_step(step))
    measured = rows[steps_to_skip:] or rows
    med = {
        k: statistics.median(r[k] for r in measured)
        for k in (
            "timing/gen_s",
            "timing/logprob_s",
            "timing/train_s",
            "timing/step_s",
            "tokens/generated",
            "prompt_length/mean",
            "response_length/mean",
        )
    }
    peak_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    result = {
        "config": {k.split("=")[0]: k.split("=", 1)[1] for k in [*DEFAULTS, *argv]},
        "dtype": str(trainer.policy.dtype),
        "machine": {
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
        },
        "steps_measured": len(measured),
        "median": med,
        "gen_tokens_per_s": med["tokens/generated"] / med["timing/gen_s"],
        "peak_rss_gb": peak_rss_gb,
    }
    path = Path(__file__).parent / "results" / "step_time.json"
    path.write_text(json.dumps(result, indent=1))
    t = Table(title="toolgrpo GRPO step time (median)")
    for c in ("gen s", "logprob s", "update s", "step s", "gen tok/s", "peak RSS GB"):
        t.add_column(c)
    t.add_row(
        *(
            f"{v:.1f}"
            for v in (
                med["timing/gen_s"],
                med["timing/logprob_s"],
                med["timing/train_s"],
                med["timing/step_s"],
                result["gen_tokens_per_s"],
                peak_rss_gb,
            )
        )
    )
    Console().print(t)
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
