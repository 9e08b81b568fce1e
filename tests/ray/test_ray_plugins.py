"""A user's environment module (``trainer.imports``) is imported by the Ray rollout workers,
fresh processes that rebuild the environments: the episodes are played there."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import read_metrics, write_jsonl
from tests.ray.conftest import all_finite, ray_overrides
from toolgrpo.envs.plugins import import_plugin
from toolgrpo.trainer.trainer import Trainer

pytestmark = pytest.mark.ray
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "toolgrpo_env_example"


def test_workers_import_the_runs_env_modules(ray_cluster, make_train_config, tmp_path, monkeypatch):
    def no_local_play(*args, **kwargs):
        raise AssertionError("episodes were played in the trainer's process")

    monkeypatch.setattr("toolgrpo.trainer.episodes.EpisodeRunner.play", no_local_play)
    path = tmp_path / "ray_reverse_env.py"
    shutil.copy(EXAMPLE / "toolgrpo_env_example" / "reverse.py", path)
    rows = import_plugin(str(path)).make_rows(["abc", "tool", "grpo", "ray"])
    data = write_jsonl(tmp_path / "rev.jsonl", rows)
    extra = {
        "actor_rollout_ref.rollout.multi_turn.enable": "true",
        # configured, so a worker without the module fails when it builds its router
        "actor_rollout_ref.rollout.multi_turn.envs": "{reverse_word: {max_turns: 2}}",
        "trainer.imports": f"[{path}]",
    }
    out = tmp_path / "out"
    trainer = Trainer(make_train_config(steps=2, out=out, data=data, **ray_overrides(1), **extra))
    try:
        trainer.fit()
    finally:
        trainer.close()
    records = read_metrics(out)
    assert [r["step"] for r in records] == [1, 2]
    for rec in records:
        all_finite(rec)
        assert rec["ray/worker_compute_s"] > 0 and rec["rollout/env_failures"] == 0.0
        assert "episode/reverse_word/turns/mean" in rec
