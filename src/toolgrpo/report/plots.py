"""Curves of a run's main metrics as inline SVG (matplotlib, Agg): nothing to fetch at view time."""

from __future__ import annotations

import io
import math
import re
from typing import Any

# (title, keys or a regex over keys, stacked): a panel is drawn when any of its keys is logged.
PANELS: tuple[tuple[str, tuple[str, ...] | str, bool], ...] = (
    (
        "Reward",
        ("reward/mean", "sampled/reward/mean", "episode/reward/mean", "router/task_reward/mean"),
        False,
    ),
    ("Held-out", r"^val/(all/accuracy|all/reward_mean|reward/mean|accuracy|format_rate)$", False),
    (
        "Tool calls and errors",
        (
            "episode/tool_calls/mean",
            "episode/tool_error_rate",
            "val/all/tool_call_rate",
            "val/all/tool_error_rate",
        ),
        False,
    ),
    (
        "Groups with signal",
        ("reward/groups_all_equal_frac", "filter_groups/informative_frac"),
        False,
    ),
    ("Router: λ and cost", ("router/lambda", "router/cost/mean", "router/budget"), False),
    (
        "Importance weights and clipping",
        (
            "actor/importance_log_ratio_mean",
            "actor/importance_weight_truncated_frac",
            "actor/clipfrac",
        ),
        False,
    ),
    ("Loss, KL, entropy", ("actor/pg_loss", "actor/kl", "actor/entropy"), False),
    (
        "Step time split (s)",
        ("timing/gen_s", "timing/logprob_s", "timing/train_s", "timing/weight_sync_s"),
        True,
    ),
)


def panel_keys(spec: tuple[str, ...] | str, present: set[str]) -> list[str]:
    if isinstance(spec, str):
        return sorted(k for k in present if re.search(spec, k))
    return [k for k in spec if k in present]


def series(metrics: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for rec in metrics:
        v = rec.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(float(rec.get("step", len(xs))))
            ys.append(float(v))
    return xs, ys


def _num(v: Any) -> float:
    """A logged value as a number: null, NaN or an edited non-number counts as 0."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else 0.0


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog and doctype: the page is HTML


def metric_svgs(metrics: list[dict[str, Any]]) -> list[tuple[str, list[str], str]]:
    """``(title, keys, svg)`` for each panel with data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    plt.rcParams["svg.fonttype"] = "none"  # text stays text: small and searchable
    present = {k for rec in metrics for k in rec}
    out = []
    for title, spec, stacked in PANELS:
        keys = panel_keys(spec, present)
        if not keys:
            continue
        fig, ax = plt.subplots(figsize=(5.2, 2.8))
        if stacked:
            steps = [float(r["step"]) for r in metrics if all(k in r for k in keys)]
            ys = [[_num(r[k]) for r in metrics if all(k in r for k in keys)] for k in keys]
            if steps:
                ax.stackplot(steps, *ys, labels=keys)
        else:
            for k in keys:
                xs, ys1 = series(metrics, k)
                ax.plot(xs, ys1, marker="o" if len(xs) < 30 else None, ms=3, label=k)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
        out.append((title, keys, _svg(fig)))
        plt.close(fig)
    return out
