"""Where metrics go: metrics.jsonl (one object per step), TensorBoard, and a rich console view.

On resume from step k, lines and events after k are dropped first, so a run killed between
checkpoints and resumed shows each step exactly once.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from toolgrpo import progress as phases
from toolgrpo.trainer.run_dir import REJECTED_SUFFIX, append_line, truncate_metrics
from toolgrpo.trainer.trackers import EXTRA_BACKENDS, extra_backends

CONSOLE_KEYS = (
    "train/loss",
    "train/lr",
    "reward/mean",
    "reward/format/mean",
    "reward/correctness/mean",
    "actor/pg_loss",
    "actor/entropy",
    "response_length/mean",
    "timing/step_s",
)
# Held-out metrics shown when a line has them (the step-0 line has nothing else), episode or
# single-turn validation.
VAL_CONSOLE_KEYS = (
    "val/all/accuracy",
    "val/all/reward_mean",
    "val/all/tool_call_rate",
    "val/all/tool_error_rate",
    "val/reward/mean",
    "val/format_rate",
    "val/exact_call_rate",
)


def console_line(metrics: dict[str, Any], step: int) -> str:
    """``step N: key=value ...`` of the console keys present (training, then held-out)."""
    shown = "  ".join(
        f"{k.split('/', 1)[-1] if k.startswith('reward/') else k}={metrics[k]:.3g}"
        for k in (*CONSOLE_KEYS, *VAL_CONSOLE_KEYS)
        if isinstance(metrics.get(k), (int, float))
    )
    return f"step {step}: {shown}" if shown else f"step {step}: (no metrics)"


def truncate_jsonl(path: Path, last_step: int) -> None:
    """Keep only records with ``step <= last_step``; a line that is no step's record (torn by a
    kill, or edited: ``[1, 2]``) is set aside in ``metrics.jsonl.rejected``, and said so."""
    bad = truncate_metrics(path, last_step)
    if bad:
        n, _, why = bad[0]
        print(
            f"toolgrpo: set aside {len(bad)} line(s) of {path} that are no step's record "
            f"(line {n}: {why}) in {path.name}{REJECTED_SUFFIX}",
            file=sys.stderr,
            flush=True,
        )


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN; null is explicit
    return v


class Tracker:
    def __init__(
        self,
        output_dir: str | Path,
        backends: list[str],
        total_steps: int,
        start_step: int = 0,
        console: Console | None = None,
        title: str = "train",
        run_names: tuple[str, str] = ("toolgrpo", "run"),  # project, experiment (wandb, mlflow)
        config: dict[str, Any] | None = None,
    ) -> None:
        unknown = set(backends) - {"console", "jsonl", "tensorboard", *EXTRA_BACKENDS}
        if unknown:
            raise ValueError(f"unknown trainer.logger backend(s) {sorted(unknown)}")
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.dir / "metrics.jsonl" if "jsonl" in backends else None
        if self.jsonl is not None:
            truncate_jsonl(self.jsonl, start_step)
        self.tb = None
        if "tensorboard" in backends:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.dir / "tensorboard"), purge_step=start_step + 1)
        self.console = console or Console(stderr=True)
        self.extra = extra_backends(backends, self.dir, *run_names, config or {})
        self.progress = None
        if "console" in backends:
            self.progress = Progress(
                TextColumn(f"[bold]{title}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.description}"),
                console=self.console,
            )
            self.progress.start()
            self.task = self.progress.add_task("", total=total_steps, completed=start_step)
            # Inside-step phases (generation, validation, update): bars on a terminal, else lines.
            self.reporter = phases.Reporter(self.console, self.progress)
            self._old_reporter = phases.set_reporter(self.reporter)

    @classmethod
    def for_run(cls, cfg: Any, out: Path, total_steps: int, start_step: int) -> Tracker:
        """A training run's tracker: its backends, and its names and config for wandb/mlflow."""
        from toolgrpo.config.schema import as_dict

        t = cfg.trainer
        names = (t.project_name, t.experiment_name)
        return cls(out, t.logger, total_steps, start_step, run_names=names, config=as_dict(cfg))

    def begin_step(self, step: int) -> None:
        """Label the inside-step phases that follow (``step N generation: ...``)."""
        if self.progress is not None:
            self.reporter.label = f"step {step}"

    def log(self, metrics: dict[str, Any], step: int) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        if self.jsonl is not None:
            append_line(self.jsonl, json.dumps(record))  # never through a link
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()
        for b in self.extra:
            b.log(metrics, step)
        if self.progress is not None:
            self.progress.update(self.task, completed=step, description="")
            line = console_line(metrics, step)  # one line, however narrow the console
            self.progress.console.print(line, soft_wrap=True, markup=False, highlight=False)

    def close(self) -> None:
        if self.progress is not None:
            phases.set_reporter(self._old_reporter)
            self.progress.stop()
        if self.tb is not None:
            self.tb.close()
        for b in self.extra:
            b.close()
