"""Plot a run's reward curves from metrics.jsonl into a PNG (the README's figure): the training
batch means (left) and, when the run validated, the fixed held-out set scored greedily (right).
Multi-turn runs (per-task-type ``val/<type>/accuracy``) plot reward and accuracy per task type.

python scripts/plot_metrics.py outputs/grpo_smollm2_rlla/metrics.jsonl docs/img/grpo_reward.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TRAIN = [
    ("reward/mean", "total"),
    ("reward/format/mean", "format"),
    ("reward/correctness/mean", "correctness"),
    ("reward/format_rate", "format rate"),
]
VAL = [(f"val/{k}", label) for k, label in TRAIN]


def _panel(ax, rows, keys, title: str) -> None:
    for key, label in keys:
        pts = [(r["step"], r[key]) for r in rows if key in r]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set_xlabel("GRPO step")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _multi_turn_keys(rows: list[dict]) -> tuple[list, list] | None:
    """Training reward and held-out accuracy per task type, when the run played episodes."""
    keys = {k for r in rows for k in r if k.startswith("val/") and k.endswith("/accuracy")}
    types = sorted({k.split("/")[1] for k in keys if k.count("/") == 2} - {"all"})
    if not types:
        return None
    train = [("reward/mean", "all"), *((f"reward/{t}/mean", t) for t in types)]
    train.append(("episode/tool_error_rate", "tool error rate"))
    val = [("val/all/accuracy", "all"), *((f"val/{t}/accuracy", t) for t in types)]
    return train, val


def main(metrics: str, out: str) -> None:
    rows = [json.loads(x) for x in Path(metrics).read_text().splitlines() if x.strip()]
    if (mt := _multi_turn_keys(rows)) is not None:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        _panel(axes[0], rows, mt[0], "training batch (sampled, T=1): reward")
        n = next(int(r["val/all/tasks"]) for r in rows if "val/all/tasks" in r)
        _panel(axes[1], rows, mt[1], f"held-out accuracy ({n} test tasks, greedy)")
        return _save(fig, metrics, out)
    has_val = any("val/reward/mean" in r for r in rows)
    fig, axes = plt.subplots(1, 2 if has_val else 1, figsize=(11 if has_val else 7, 4))
    axes = list(axes) if has_val else [axes]
    _panel(axes[0], rows, TRAIN, "training batch (sampled, T=1)")
    axes[0].set_ylabel("reward")
    if has_val:
        n = next(int(r["val/num_tasks"]) for r in rows if "val/num_tasks" in r)
        _panel(axes[1], rows, VAL, f"held-out RLLA test tasks (first {n}, greedy)")
    _save(fig, metrics, out)


def _save(fig, metrics: str, out: str) -> None:
    fig.suptitle(Path(metrics).parent.name)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
