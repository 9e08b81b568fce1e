"""Builds the report page: config, metric curves, a trajectory viewer; one file, no network."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

from toolgrpo.report.assets import CSS, JS
from toolgrpo.report.data import RunData, load_run
from toolgrpo.report.plots import metric_svgs
from toolgrpo.safe_io import write_text
from toolgrpo.trainer.summary import best_held_out


def _script_json(obj: Any) -> str:
    """JSON safe inside a <script> element: no ``</script>`` or ``<!--`` can end it early."""
    text = json.dumps(obj, default=str, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return v


def render(data: RunData) -> str:
    e = html.escape
    plots = metric_svgs(data.metrics) if data.metrics else []
    n_rows = sum(len(v) for v in data.dumps.values())
    best = best_held_out(data.metrics)
    summary = [
        f"{len(data.metrics)} logged steps",
        f"{n_rows} dumped episodes over {len(data.dumps)} steps"
        + (f" ({e(str(data.dump_dir))})" if data.dump_dir else ""),
    ]
    if best is not None:
        summary.append(f"best held-out {e(best[0])} = {best[1]:.3f} at step {best[2]}")
    if data.skipped_lines:
        summary.append(f"{data.skipped_lines} unreadable lines skipped")
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>toolgrpo report: {e(data.run_dir.name)}</title><style>{CSS}</style></head><body>",
        f"<h1>toolgrpo report: {e(str(data.run_dir))}</h1>",
        f"<p class='muted' id='summary'>{' · '.join(summary)}</p>",
        "<h2>Metrics</h2>",
    ]
    if plots:
        parts.append("<div class='plots'>")
        for _title, keys, svg in plots:
            parts.append(f"<div class='plot' title='{e(', '.join(keys))}'>{svg}</div>")
        parts.append("</div>")
    else:
        parts.append("<p class='muted'>no metrics.jsonl in this run</p>")
    parts += [
        "<h2>Trajectories</h2>",
        "<div class='legend'><span class='trained'>trained tokens (mask 1)</span>"
        "<span class='masked'>masked: tool results, turn markers (mask 0)</span></div>",
        "<div class='controls'><label>step <select id='step'></select></label>"
        "<span><span id='step-count'>0</span> episodes this step</span>"
        "<label>task (GRPO group) <select id='group'></select></label>"
        "<span><span id='episode-count'>0</span> in this group</span></div>",
    ]
    if not data.dumps:
        parts.append(
            "<p class='muted'>no rollout dumps: set trainer.rollout_data_dir (or "
            "toolgrpo eval --rollout-data-dir) to record episodes</p>"
        )
    parts += [
        "<div id='episodes' class='group'></div>",
        "<h2>Config</h2>",
        f"<pre class='config'>{e(data.config_text) or 'no config.yaml'}</pre>",
        "<script type='application/json' id='rollouts'>",
        _script_json({str(k): _clean(v) for k, v in sorted(data.dumps.items())}),
        "</script>",
        f"<script>{JS}</script></body></html>",
    ]
    return "\n".join(parts)


def write_report(
    run_dir: str | Path, output: str | Path | None = None, rollout_data_dir: str | None = None
) -> Path:
    """``toolgrpo report``: write ``<run>/report.html`` (or ``output``) and return its path."""
    data = load_run(run_dir, rollout_data_dir)
    out = Path(output) if output else data.run_dir / "report.html"
    return write_text(out, render(data))  # never through a link
