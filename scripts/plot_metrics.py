"""Plot reward curves from a run's metrics.jsonl into a PNG (used for the README's figure).

python scripts/plot_metrics.py outputs/grpo_smollm2_rlla/metrics.jsonl docs/img/grpo_reward.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KEYS = [
    ("reward/mean", "total"),
    ("reward/format/mean", "format"),
    ("reward/correctness/mean", "correctness"),
    ("reward/format_rate", "format rate"),
]


def main(metrics: str, out: str) -> None:
    rows = [json.loads(x) for x in Path(metrics).read_text().splitlines() if x.strip()]
    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in KEYS:
        if all(key in r for r in rows):
            ax.plot(steps, [r[key] for r in rows], marker="o", label=label)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward (batch mean)")
    ax.set_title(Path(metrics).parent.name)
    ax.grid(alpha=0.3)
    ax.legend()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
