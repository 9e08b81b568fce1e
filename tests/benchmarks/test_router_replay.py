"""benchmarks/router_replay.py on a hand-made table: two task types whose features share one
dominant direction; the calculator pays on one only. Out of fold, the standardized head spends
the budget on that type and beats the task-blind mix; the layer-normed head does not."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from router_replay import run, summarize  # noqa: E402


def _table(n: int = 40) -> tuple[torch.Tensor, list[dict]]:
    g = torch.Generator().manual_seed(0)
    shared = 8 * torch.randn(16, generator=g)
    centers = torch.randn(2, 16, generator=g)
    rows, feats = [], []
    for i in range(n):
        kind = i % 2  # 0: math (the tool pays), 1: chat (it adds nothing)
        feats.append(shared + centers[kind] + 0.1 * torch.randn(16, generator=g))
        rows.append(
            {
                "task_id": str(i),
                "task_type": ("math", "chat")[kind],
                "probs": {"ANSWER": 0.5, "CALCULATE": 0.5},
                "reward": {"ANSWER": (0.0, 0.8)[kind], "CALCULATE": (1.0, 0.8)[kind]},
                "cost": {"ANSWER": 0.0, "CALCULATE": 1.0},
            }
        )
    return torch.stack(feats), rows


ARGS = Namespace(
    steps=150,
    tasks=12,
    n=4,
    budget=0.5,
    lr=1.0,
    dual_lr=0.2,
    dual_kp=2.0,
    entropy_coeff=0.01,
    head_ema=0.95,
)


def test_out_of_fold_heads_score_every_task_and_the_standardized_one_discriminates():
    feats, rows = _table()
    need = [r["task_type"] == "math" for r in rows]
    got = {
        norm: summarize([run(feats, rows, norm, s, ARGS) for s in (0, 1)], need)
        for norm in ("standardize", "layer")
    }
    std, layer = got["standardize"], got["layer"]
    assert abs(std["cost"] - 0.5) < 0.1, std
    assert std["route_share"]["math"]["CALCULATE"] > 0.8, std
    assert std["route_share"]["chat"]["ANSWER"] > 0.8, std
    assert std["auroc"] > 0.95 and std["gain_vs_fixed_mix"] > 0.05, std
    assert std["gain_vs_fixed_mix"] > layer["gain_vs_fixed_mix"] + 0.03, (std, layer)
    assert len(std["per_seed"]) == 2
