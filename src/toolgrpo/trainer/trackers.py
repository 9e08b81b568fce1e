"""Experiment trackers users of verl and TRL expect, as optional ``trainer.logger`` backends.

``wandb`` (extra ``toolgrpo[wandb]``) runs offline unless ``WANDB_MODE`` says otherwise, so a run
needs no network or account (``wandb sync`` uploads it later); ``mlflow`` (extra
``toolgrpo[mlflow]``) writes to a local store, ``<output_dir>/mlflow.db`` (SQLite; MLflow 3 retired
the plain-file store) with artifacts in ``<output_dir>/mlartifacts``, unless
``MLFLOW_TRACKING_URI`` is set (view it: ``mlflow ui --backend-store-uri sqlite:///<db>``).
A backend whose package is missing fails at startup with the pip command, not mid-run.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from toolgrpo.errors import UserError

EXTRA_BACKENDS = ("wandb", "mlflow")


class TrackerMissing(UserError):
    """``trainer.logger`` names a backend whose package is not installed."""


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def _require(module: str) -> Any:
    try:
        return __import__(module)
    except ImportError as e:
        raise TrackerMissing(
            f"trainer.logger={module} needs the {module} package: pip install 'toolgrpo[{module}]'"
        ) from e


class WandbBackend:
    def __init__(self, out: Path, project: str, name: str, config: dict[str, Any]) -> None:
        wandb = _require("wandb")
        mode = os.environ.get("WANDB_MODE", "offline")  # no network unless asked for
        self.run = wandb.init(
            project=project, name=name, dir=str(out), mode=mode, config=config, reinit=True
        )

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.run.log(_numbers(metrics), step=step, commit=True)  # each step whole, now

    def close(self) -> None:
        self.run.finish()


class MlflowBackend:
    def __init__(self, out: Path, project: str, name: str, config: dict[str, Any]) -> None:
        self.mlflow = _require("mlflow")
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        self.mlflow.set_tracking_uri(uri or f"sqlite:///{(out / 'mlflow.db').resolve()}")
        if uri is None and self.mlflow.get_experiment_by_name(project) is None:
            artifacts = (out / "mlartifacts").resolve().as_uri()  # not ./mlruns under the cwd
            self.mlflow.create_experiment(project, artifact_location=artifacts)
        self.mlflow.set_experiment(project)
        self.run = self.mlflow.start_run(run_name=name)
        self.mlflow.log_dict(config, "config.json")

    def log(self, metrics: dict[str, Any], step: int) -> None:
        # MLflow keys allow letters, digits, _ - . / and spaces; ours already do.
        self.mlflow.log_metrics(_numbers(metrics), step=step)

    def close(self) -> None:
        self.mlflow.end_run()


def extra_backends(
    names: list[str], out: Path, project: str, name: str, config: dict[str, Any]
) -> list[Any]:
    made: list[Any] = []
    for b in names:
        if b == "wandb":
            made.append(WandbBackend(out, project, name, config))
        elif b == "mlflow":
            made.append(MlflowBackend(out, project, name, config))
    return made
