"""Print the provenance record of a warm-start SFT run (command, data hash, steps, loss, eval)."""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import torch
import transformers

import toolgrpo


def main(run_dir: str) -> None:
    d = Path(run_dir)
    sft = json.loads((d / "sft_result.json").read_text())
    ev = json.loads((d / "eval_test.json").read_text()) if (d / "eval_test.json").is_file() else {}
    losses = [json.loads(x)["train/loss"] for x in (d / "metrics.jsonl").read_text().splitlines()]
    record = {
        "command": "bash scripts/make_warmstart.sh  (toolgrpo sft configs/sft_smollm2_toolrl.yaml)",
        "config": (d / "config.yaml").read_text(),
        "base_model": sft["base_model"],
        "data": "rlla:sft (embedded RLLA SFT rows, RL-convention targets, test-split row removed)",
        "examples": sft["examples"],
        "dropped_too_long": sft["dropped_too_long"],
        "data_hash_sha256": sft["data_hash"],
        "steps": sft["steps"],
        "loss_first": losses[0] if losses else None,
        "loss_final": sft["final_loss"],
        "eval_rlla_test": {
            k: ev.get(k)
            for k in (
                "num_tasks",
                "reward_mean",
                "format_mean",
                "correctness_mean",
                "format_rate",
                "exact_call_rate",
            )
        },
        "versions": {
            "toolgrpo": toolgrpo.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
    }
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
