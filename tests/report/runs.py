"""A hand-made run directory for report tests: metrics, config and rollout dumps, no training."""

from __future__ import annotations

import json
from pathlib import Path

HOSTILE = '<img src=x onerror="window.pwned=1"></script><script>window.pwned=1</script>'


def episode_row(step: int, uid: str, task: str, reward: float, negative: bool = False) -> dict:
    return {
        "step": step,
        "task_id": task,
        "task_type": "calculator",
        "uid": uid,
        "policy": "actor",
        "route": "CALCULATE",
        "negative": negative,
        "prompt": "<|im_start|>user\nwhat is 2+2?<|im_end|>\n",
        "messages": [],
        "tool_calls": [{"turn": 1, "name": "calc", "result": HOSTILE}],
        "spans": [
            {"text": "<tool_call>{...}</tool_call>", "trained": True, "tokens": 5},
            {"text": "<tool_response>4</tool_response>", "trained": False, "tokens": 4},
            {"text": "The answer is 4.", "trained": True, "tokens": 5},
        ],
        "reward": reward,
        "reward_parts": {"correct": reward},
        "stop_reason": "answer",
    }


def make_run(root: Path, steps: int = 3, group: int = 4, tasks: int = 2) -> Path:
    """``steps`` steps of ``tasks`` groups of ``group`` episodes (one rolled-back negative each)."""
    run = root / "run"
    dumps = run / "rollout_data"
    dumps.mkdir(parents=True)
    (run / "config.yaml").write_text(
        "trainer:\n  rollout_data_dir: ''\n  note: '" + HOSTILE + "'\n"
    )
    with (run / "metrics.jsonl").open("w") as fh:
        for s in range(0, steps + 1):
            rec = {"step": s, "val/all/accuracy": 0.1 * s, "val/all/tool_error_rate": 0.5 / (s + 1)}
            if s:
                rec.update(
                    {
                        "reward/mean": 0.2 * s,
                        "episode/tool_calls/mean": 1.0,
                        "episode/tool_error_rate": 0.1,
                        "router/lambda": 0.01 * s,
                        "router/cost/mean": 0.5,
                        "timing/gen_s": 2.0,
                        "timing/train_s": 1.0,
                        "timing/logprob_s": 0.5,
                        "actor/pg_loss": float("nan") if s == 2 else 0.1,
                    }
                )
            fh.write(json.dumps(rec).replace("NaN", "null") + "\n")
        fh.write('{"step": 9, "torn')  # a killed run's last line
    for s in range(1, steps + 1):
        with (dumps / f"{s}.jsonl").open("w") as fh:
            for t in range(tasks):
                for i in range(group):
                    row = episode_row(s, f"u{s}-{t}", f"task{t}", float(i % 2))
                    fh.write(json.dumps(row) + "\n")
                fh.write(json.dumps(episode_row(s, f"u{s}-{t}", f"task{t}", 0.0, True)) + "\n")
    return run
