"""``trainer.logger`` backends wandb (offline) and mlflow (local file store), issue #20 item 6.
Each is skipped when its extra is not installed; on main neither name was accepted."""

from __future__ import annotations

import time

import pytest

from toolgrpo.config.loader import ConfigError
from toolgrpo.config.validate import validate_train_config
from toolgrpo.trainer.tracking import Tracker

STEPS = [{"reward/mean": 0.25, "val/all/accuracy": 0.5, "flag": True}, {"reward/mean": 0.75}]


def test_wandb_offline_run_is_written_without_network(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline is our default
    monkeypatch.setenv("WANDB_SILENT", "true")
    t = Tracker(tmp_path, ["wandb"], 2, run_names=("proj", "exp"), config={"a": {"b": 1}})
    run = t.extra[0].run
    for i, m in enumerate(STEPS, 1):
        t.log(m, i)
    assert run.summary["reward/mean"] == 0.75 and run.summary["val/all/accuracy"] == 0.5
    assert "flag" not in run.summary.keys()  # only numbers are logged
    t.close()
    (offline,) = (tmp_path / "wandb").glob("offline-run-*")  # what `wandb sync` uploads later
    (data,) = offline.glob("*.wandb")
    deadline = time.time() + 30  # wandb's service process may still be flushing the file
    while b"0.75" not in data.read_bytes() and time.time() < deadline:
        time.sleep(0.2)
    raw = data.read_bytes()
    assert b"reward/mean" in raw and b"0.75" in raw and b"proj" in raw


def test_mlflow_local_file_store(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    t = Tracker(tmp_path, ["mlflow"], 2, run_names=("proj", "exp"), config={"a": 1})
    run_id = t.extra[0].run.info.run_id
    for i, m in enumerate(STEPS, 1):
        t.log(m, i)
    t.close()
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    hist = client.get_metric_history(run_id, "reward/mean")
    assert [(h.step, h.value) for h in hist] == [(1, 0.25), (2, 0.75)]
    run = client.get_run(run_id)
    assert run.info.run_name == "exp" and run.info.status == "FINISHED"
    assert run.info.artifact_uri.startswith((tmp_path / "mlartifacts").resolve().as_uri())


def test_training_run_logs_to_mlflow(make_train_config, tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from toolgrpo.trainer.trainer import Trainer

    out = tmp_path / "run"
    Trainer(make_train_config(steps=2, out=out, **{"trainer.logger": "[jsonl,mlflow]"})).fit()
    client = mlflow.tracking.MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("toolgrpo").experiment_id])
    assert [h.step for h in client.get_metric_history(run.info.run_id, "reward/mean")] == [1, 2]


def test_missing_extra_fails_before_the_model(make_train_config, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a)
    )
    with pytest.raises(ConfigError, match=r"pip install 'toolgrpo\[wandb\]'"):
        validate_train_config(make_train_config(**{"trainer.logger": "[jsonl,wandb]"}))
    with pytest.raises(ConfigError, match="trainer.logger"):
        validate_train_config(make_train_config(**{"trainer.logger": "[comet]"}))
