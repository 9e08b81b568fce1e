"""What a report reads from a run directory: its config, ``metrics.jsonl`` and rollout dumps."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from toolgrpo.errors import UserError
from toolgrpo.trainer.run_dir import read_records

DEFAULT_DUMP_DIR = "rollout_data"  # looked for inside the run when the config names none


@dataclass
class RunData:
    run_dir: Path
    config_text: str = ""
    metrics: list[dict[str, Any]] = field(default_factory=list)
    dumps: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # step -> rows
    dump_dir: Path | None = None
    skipped_lines: int = 0  # torn or non-JSON lines, counted rather than fatal


class ReportError(UserError):
    """The run directory holds nothing to report (the CLI prints one line)."""


def _jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    rows, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            bad += 1  # a torn last line of a killed run
            continue
        if isinstance(rec, dict):
            rows.append(rec)
        else:
            bad += 1
    return rows, bad


def find_dump_dir(run_dir: Path, config_text: str, override: str | None) -> Path | None:
    """``--rollout-data-dir``, else the config's ``trainer.rollout_data_dir`` (as given, then
    relative to the run), else ``<run>/rollout_data``."""
    candidates: list[Path] = []
    if override:
        return Path(override)
    try:
        cfg = yaml.safe_load(config_text) or {}
        named = (cfg.get("trainer") or {}).get("rollout_data_dir") or ""
    except yaml.YAMLError:
        named = ""
    if named:
        candidates += [Path(named), run_dir / named]
    candidates.append(run_dir / DEFAULT_DUMP_DIR)
    return next((c for c in candidates if c.is_dir()), None)


def load_run(run_dir: str | Path, rollout_data_dir: str | None = None) -> RunData:
    run = Path(run_dir)
    if not run.is_dir():
        raise ReportError(f"{run} is not a directory")
    data = RunData(run)
    if (run / "config.yaml").is_file():
        data.config_text = (run / "config.yaml").read_text(errors="replace")
    if (run / "metrics.jsonl").is_file():  # a line that is no step's record is skipped
        data.metrics, bad = read_records(run / "metrics.jsonl")
        data.skipped_lines = len(bad)
    data.dump_dir = find_dump_dir(run, data.config_text, rollout_data_dir)
    if data.dump_dir is not None and data.dump_dir.is_dir():
        for f in sorted(data.dump_dir.glob("*.jsonl")):
            if f.stem.isdigit():
                rows, bad = _jsonl(f)
                data.dumps[int(f.stem)] = rows
                data.skipped_lines += bad
    if not (data.config_text or data.metrics or data.dumps):
        raise ReportError(
            f"{run} has no config.yaml, metrics.jsonl or rollout dumps (trainer.rollout_data_dir)"
        )
    return data
