"""Resuming: after SIGKILL every step is logged exactly once, and a resumed run continues the
same task order (and, on the tiny model, the same trajectory) as an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from tests.conftest import read_metrics, train_overrides
from toolgrpo.rewards.scoring import Score
from toolgrpo.trainer import rollout_stage as trainer_mod
from toolgrpo.trainer.checkpoint import list_checkpoints
from toolgrpo.trainer.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]


def _varied_score(task, text, step, flags):
    v = float(zlib.crc32(text.encode()) % 7) - 3.0
    return Score(v, 0.0, v, 0.0, False, False)


def _steps(out) -> list[int]:
    return [r["step"] for r in read_metrics(out)]


def _count_lines(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    except FileNotFoundError:
        return 0


def test_kill_9_then_resume_logs_each_step_once(tiny_model_dir, tiny_data, tmp_path):
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "toolgrpo.cli",
        "train",
        *train_overrides(
            tiny_model_dir,
            tiny_data,
            out,
            steps=6,
            **{"trainer.save_freq": 1, "data.max_response_length": 24},
        ),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    metrics = out / "metrics.jsonl"
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.time() + 300
        while _count_lines(metrics) < 2:
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.time() < deadline, "training never logged two steps"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    killed_at = _steps(out)
    assert 2 <= len(killed_at) < 6, f"the kill came too late to test anything: {killed_at}"
    assert list_checkpoints(out), "no checkpoint was complete at the kill"

    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _steps(out) == [1, 2, 3, 4, 5, 6]
    assert [s for s, _ in list_checkpoints(out)] == [5, 6]  # max_checkpoints=2
    assert not list((out / "checkpoints").glob(".tmp_*"))


def _record_batches(trainer: Trainer) -> list[list[str]]:
    seen: list[list[str]] = []
    orig = trainer.sampler.next_batch

    def next_batch():
        idx = orig()
        seen.append([trainer.tasks[i].task_id for i in idx])
        return idx

    trainer.sampler.next_batch = next_batch
    return seen


def test_resume_continues_the_sampler_and_trajectory(make_train_config, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_mod, "score", _varied_score)
    extra = {
        "trainer.save_freq": 1,
        "actor_rollout_ref.actor.optim.lr": 1e-3,
        "data.train_batch_size": 2,
        "data.max_samples": 5,  # 2 batches per epoch + a dropped tail: crosses an epoch boundary
    }
    full = Trainer(make_train_config(steps=5, out=tmp_path / "full", **extra))
    full_batches = _record_batches(full)
    full_hist = full.fit()

    part_out = tmp_path / "part"
    first = Trainer(make_train_config(steps=3, out=part_out, **extra))
    first_batches = _record_batches(first)
    first.fit()
    assert first_batches == full_batches[:3]

    resumed = Trainer(make_train_config(steps=5, out=part_out, **extra))
    assert resumed.step == 3
    assert resumed.sampler.state_dict() == {"epoch": 1, "position": 2}
    rest = _record_batches(resumed)
    hist = resumed.fit()
    assert len(hist) == 2
    assert rest == full_batches[3:]
    assert _steps(part_out) == [1, 2, 3, 4, 5]
    # Weights, optimizer moments and RNG are restored: steps 4-5 replay exactly.
    for a, b in zip(hist, full_hist[3:], strict=True):
        for k in ("reward/mean", "tokens/generated", "response_length/mean", "epoch"):
            assert a[k] == b[k], k
        assert a["actor/pg_loss"] == pytest.approx(b["actor/pg_loss"], abs=1e-5)


def test_resume_explicit_dir(make_train_config, tmp_path):
    """(``trainer.resume=disable`` in a used directory is refused now: tests/trainer/
    test_output_dir.py.)"""
    out = tmp_path / "r"
    Trainer(make_train_config(steps=2, out=out, **{"trainer.save_freq": 1})).fit()
    assert [s for s, _ in list_checkpoints(out)] == [1, 2]
    ckpt1 = out / "checkpoints" / "global_step_1"
    explicit = Trainer(make_train_config(steps=2, out=out, **{"trainer.resume": str(ckpt1)}))
    assert explicit.step == 1
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        Trainer(make_train_config(steps=2, out=out, **{"trainer.resume": str(tmp_path)}))


def test_finished_run_resumes_to_nothing(make_train_config, tmp_path):
    out = tmp_path / "done"
    Trainer(make_train_config(steps=2, out=out)).fit()
    again = Trainer(make_train_config(steps=2, out=out))
    assert again.step == 2
    assert again.fit() == []
    assert _steps(out) == [1, 2]


def test_lora_run_resumes(make_train_config, tmp_path):
    out = tmp_path / "lora"
    extra = {"actor_rollout_ref.model.lora_rank": 4, "trainer.save_freq": 1}
    Trainer(make_train_config(steps=1, out=out, **extra)).fit()
    ckpt = out / "checkpoints" / "global_step_1"
    assert json.loads((ckpt / "trainer_state.json").read_text())["is_lora"] is True
    resumed = Trainer(make_train_config(steps=2, out=out, **extra))
    assert resumed.step == 1
    resumed.fit()
    assert _steps(out) == [1, 2]
    with pytest.raises(ValueError, match="lora_rank 4 → 0"):
        Trainer(make_train_config(steps=3, out=out, **{"trainer.save_freq": 1}))


def test_resume_drops_metrics_after_the_checkpoint_and_torn_lines(make_train_config, tmp_path):
    out = tmp_path / "trunc"
    Trainer(make_train_config(steps=3, out=out, **{"trainer.save_freq": 2})).fit()
    assert [s for s, _ in list_checkpoints(out)] == [2, 3]
    import shutil

    shutil.rmtree(out / "checkpoints" / "global_step_3")  # as if killed before saving step 3
    with (out / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 4, "reward/me')  # a line torn by the kill
    resumed = Trainer(make_train_config(steps=4, out=out, **{"trainer.save_freq": 2}))
    assert resumed.step == 2
    resumed.fit()
    assert _steps(out) == [1, 2, 3, 4]


class _Killed(BaseException):
    """Stands in for SIGKILL: nothing after the raise point runs."""


def test_kill_between_checkpoint_and_log_keeps_every_step(make_train_config, tmp_path, monkeypatch):
    out = tmp_path / "gap"
    extra = {"trainer.save_freq": 1}
    trainer = Trainer(make_train_config(steps=4, out=out, **extra))
    orig_save = Trainer.save_checkpoint

    def save_then_die(self):
        path = orig_save(self)
        if self.step == 2:
            raise _Killed()
        return path

    monkeypatch.setattr(Trainer, "save_checkpoint", save_then_die)
    with pytest.raises(_Killed):
        trainer.fit()
    monkeypatch.setattr(Trainer, "save_checkpoint", orig_save)
    Trainer(make_train_config(steps=4, out=out, **extra)).fit()
    assert _steps(out) == [1, 2, 3, 4]
