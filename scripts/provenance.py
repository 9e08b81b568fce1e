"""Print the provenance record of a warm-start SFT run (command, data hash, steps, loss, eval)."""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch
import transformers

import toolgrpo

RLLA_COMMAND = "bash scripts/make_warmstart.sh  (toolgrpo sft configs/sft_smollm2_toolrl.yaml)"
RLLA_DATA = "rlla:sft (embedded RLLA SFT rows, RL-convention targets, test-split row removed)"
RLLA_KEYS = (
    "num_tasks",
    "reward_mean",
    "format_mean",
    "correctness_mean",
    "format_rate",
    "exact_call_rate",
)
EPISODE_KEYS = ("episodes", "accuracy", "accuracy_se", "tool_call_rate", "calls_per_episode")


def episode_eval(path: Path) -> dict | None:
    """Per task type, the headline numbers of an episode eval (``toolgrpo eval`` on env tasks)."""
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())["summary"]
    keys = (*EPISODE_KEYS, "tool_error_rate")
    return {t: {k: s[k] for k in keys} for t, s in summary.items()}


def main(run_dir: str, command: str = RLLA_COMMAND, data: str = RLLA_DATA) -> None:
    d = Path(run_dir)
    sft = json.loads((d / "sft_result.json").read_text())
    ev = json.loads((d / "eval_test.json").read_text()) if (d / "eval_test.json").is_file() else {}
    losses = [json.loads(x)["train/loss"] for x in (d / "metrics.jsonl").read_text().splitlines()]
    record = {
        "command": command,
        "config": (d / "config.yaml").read_text(),
        "base_model": sft["base_model"],
        "data": data,
        "examples": sft["examples"],
        "dropped_too_long": sft["dropped_too_long"],
        "data_hash_sha256": sft["data_hash"],
        "steps": sft["steps"],
        "loss_first": losses[0] if losses else None,
        "loss_final": sft["final_loss"],
        "eval_rlla_test": (
            {k: ev.get(k) for k in RLLA_KEYS} if ev else None  # None: not evaluated
        ),
        "eval_env_test": episode_eval(d / "eval_env_test.json"),
        "versions": {
            "toolgrpo": toolgrpo.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
    }
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run_dir")
    ap.add_argument("--command", default=RLLA_COMMAND)
    ap.add_argument("--data", default=RLLA_DATA)
    a = ap.parse_args()
    main(a.run_dir, a.command, a.data)
