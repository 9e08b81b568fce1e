"""Training through environment failures (issue 14 items 1–2, issue 15 item 3): failed episodes
leave the batch and are counted, the step goes on, and too many failures stop the run with one
clear line."""

from __future__ import annotations

import logging
import math
import socket
from collections.abc import Mapping
from typing import Any

import pytest
from transformers import AutoTokenizer

from tests.conftest import read_metrics, rlla_row, write_jsonl
from tests.rollout.test_multi_turn import CALL, AddEnv, ScriptedGenerator
from toolgrpo.data.task import Task
from toolgrpo.envs.registry import EnvRouter, register_env
from toolgrpo.rollout.episode import EnvFailureError, Episode
from toolgrpo.trainer.episodes import EpisodeRunner, trainable_indices
from toolgrpo.trainer.trainer import Trainer

KEY = "actor_rollout_ref.rollout.multi_turn."
ANSWER = "<answer>5</answer>"
MESSAGES = ({"role": "user", "content": "what is 2+3?"},)


class Flaky(AddEnv):
    """``add`` whose step raises on 3 calls in 10 (deterministically, over the process)."""

    calls = 0

    async def step(self, calls):
        cls = type(self)
        cls.calls += 1
        if (cls.calls * 7) % 10 < 3:
            raise ConnectionError("simulator crashed")
        return await super().step(calls)


class ResetFails(AddEnv):
    async def reset(self):
        raise KeyError("scenario 'x' not found")


@register_env("test_flaky")
def _flaky(task: Task, options: Mapping[str, Any]) -> AddEnv:
    if task.task_id == "bad":  # a malformed row: its environment cannot even be built
        raise ValueError(f"row {task.task_id} has no scenario")
    if task.task_id == "bad_reset":  # ... or cannot start its episode
        return ResetFails()
    return Flaky() if options.get("flaky") else AddEnv()


def _trainer(make_train_config, tmp_path, tiny_model_dir, tasks, flaky=False, **over) -> Trainer:
    """A tiny-model run on ``tasks`` (type ``add``) with scripted tool-calling turns."""
    steps = int(over.pop("steps", 2))
    cfg = {
        f"{KEY}enable": "true",
        f"{KEY}envs": f"{{add: {{type: test_flaky, max_turns: 3, flaky: {str(flaky).lower()}}}}}",
        "data.max_response_length": "300",
        "data.train_batch_size": str(min(4, len(tasks))),
        "actor_rollout_ref.actor.ppo_mini_batch_size": str(min(4, len(tasks))),
        **over,
    }
    trainer = Trainer(make_train_config(steps=steps, out=tmp_path / "run", **cfg))
    trainer.tasks = tasks
    trainer.sampler.num_tasks = len(tasks)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    trainer.generator = ScriptedGenerator(tok, [CALL, ANSWER])
    return trainer


def _tasks(*ids: str) -> list[Task]:
    return [Task(i, MESSAGES, "5", "test", "add") for i in ids]


def _watch(trainer: Trainer) -> list:
    seen = []
    orig = trainer.actor.update

    def update(batch):
        seen.append((batch.scores_B.tolist(), list(batch.uids)))
        return orig(batch)

    trainer.actor.update = update
    return seen


KL = {"actor_rollout_ref.actor.use_kl_loss": "true"}
EPOCHS = {"actor_rollout_ref.actor.ppo_epochs": "2"}


@pytest.mark.parametrize(
    ("bad", "over"),
    [("bad_reset", KL), ("bad_reset", EPOCHS), ("bad", KL)],
    ids=["reset-kl", "reset-ppo_epochs_2", "constructor-kl"],
)
def test_a_row_whose_environment_fails_does_not_crash_the_step(
    make_train_config, tmp_path, tiny_model_dir, bad, over
):
    """Item 1: a failed reset left the row's two episodes with empty prompts, and recomputing
    old/ref log-probs over their group crashed the step ("cannot reshape tensor of 0
    elements"); a constructor that raised (outside the loop's guard) aborted it outright."""
    trainer = _trainer(make_train_config, tmp_path, tiny_model_dir, _tasks("a", bad), **over)
    assert trainer.sampler.batch_size == 2
    seen = _watch(trainer)
    trainer.fit()
    recs = read_metrics(tmp_path / "run")
    assert [r["step"] for r in recs] == [1, 2]
    for r, (scores, uids) in zip(recs, seen, strict=True):
        assert r["rollout/env_failures"] == 2.0 and r["rollout/add/env_failures"] == 2.0
        assert r["batch/size"] == 2 == len(uids) and scores == [1.0, 1.0]  # the good row only
        assert r["episode/reward/mean"] == 1.0  # the failures are not averaged in at -1
        assert math.isfinite(r["actor/pg_loss"])


def test_thirty_percent_failing_steps_and_a_bad_row_train_on(
    make_train_config, tmp_path, tiny_model_dir
):
    """Done-when of issue 14: an environment that raises on 30 % of its steps, and on
    construction for one row, completes its steps with finite losses and counts failures."""
    Flaky.calls = 0
    tasks = _tasks("t0", "t1", "bad", "t3")
    trainer = _trainer(
        make_train_config,
        tmp_path,
        tiny_model_dir,
        tasks,
        flaky=True,
        steps=3,
        **{
            "actor_rollout_ref.rollout.n": "4",
            "actor_rollout_ref.actor.use_kl_loss": "true",
            f"{KEY}max_env_failure_ratio": "0.75",
        },
    )
    seen = _watch(trainer)
    trainer.fit()
    recs = read_metrics(tmp_path / "run")
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert Flaky.calls >= 30  # 3 steps x 12 good episodes, each stepping at least once
    total = sum(r["rollout/env_failures"] for r in recs)
    assert total >= 3 * 4 + 0.2 * Flaky.calls  # the bad row's 4 every step, plus the flaky ones
    for r, (scores, uids) in zip(recs, seen, strict=True):
        assert r["rollout/env_failures"] >= 4 and r["batch/size"] == len(scores)
        assert r["batch/size"] == 16 - r["rollout/dropped_episodes"]
        assert all(s in (0.0, 1.0) for s in scores)  # never the -1 of a failed environment
        assert all(uids.count(u) >= 2 for u in uids)  # no group left with one member
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "reward/mean"):
            assert math.isfinite(r[key]), key


def test_a_step_whose_episodes_all_failed_skips_its_update(
    make_train_config, tmp_path, tiny_model_dir
):
    """Item 1: with every episode failed (and the abort disabled) the step must not crash."""
    trainer = _trainer(
        make_train_config,
        tmp_path,
        tiny_model_dir,
        _tasks("bad", "bad"),
        **{f"{KEY}max_env_failure_ratio": "1.0"},
    )
    seen = _watch(trainer)
    trainer.fit()
    recs = read_metrics(tmp_path / "run")
    assert [r["step"] for r in recs] == [1, 2] and not seen
    assert all(r["train/skipped_update"] == 1.0 and r["rollout/env_failures"] == 4 for r in recs)


def test_too_many_failures_stop_the_run_naming_the_environment(
    make_train_config, tmp_path, tiny_model_dir
):
    trainer = _trainer(make_train_config, tmp_path, tiny_model_dir, _tasks("bad", "a"))
    trainer.cfg.actor_rollout_ref.rollout.multi_turn.max_env_failure_ratio = 0.25
    with pytest.raises(EnvFailureError) as err:
        trainer.fit()
    msg = str(err.value)
    assert "\n" not in msg and "2 of 4 episodes" in msg and "max_env_failure_ratio=0.25" in msg
    assert "environment 'test_flaky'" in msg and "ValueError: row bad has no scenario" in msg


def _episode(uid: str, failed: bool = False) -> Episode:
    e = Episode("t", "x", uid, [1], [2], [1], [-0.1])
    e.env_failure = "boom" if failed else None
    return e


def test_a_group_left_with_one_member_is_dropped_under_group_estimators():
    """Item 2: a failure must not enter its group's statistics, nor leave a lone survivor whose
    GRPO advantage would be its raw score (the singleton rule)."""
    eps = [_episode("a"), _episode("a", True), _episode("b"), _episode("b"), _episode("c", True)]
    assert trainable_indices(eps, grouped=True) == [2, 3]
    assert trainable_indices(eps, grouped=False) == [0, 2, 3]
    assert trainable_indices([_episode("solo")], grouped=True) == [0]  # n=1 is the user's


def test_failure_warnings_are_one_per_reason_per_step(make_train_config, caplog):
    cfg = make_train_config(**{f"{KEY}enable": "true"})
    runner = EpisodeRunner(cfg, None, None, EnvRouter({"x": {"type": "test_flaky"}}))
    eps = [_episode("a", True) for _ in range(6)] + [_episode("b") for _ in range(6)]
    eps[0].env_failure = "other reason"
    with caplog.at_level(logging.WARNING, logger="toolgrpo.trainer.episodes"):
        assert runner.trainable(eps, step=3) == list(range(6, 12))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "step 3: 5 episode(s) of task type 'x' (environment 'test_flaky') failed in the "
        "environment: boom",
        "step 3: 1 episode(s) of task type 'x' (environment 'test_flaky') failed in the "
        "environment: other reason",
    ]


def test_a_dead_environment_server_stops_the_run_with_one_line(
    tiny_model_dir, tmp_path, capsys, caplog
):
    """Issue 15 item 3: with nothing listening, every episode scored -1, grad_norm was 0 and
    `toolgrpo train` exited 0; now the reason is printed and the run stops with exit code 2."""
    from tests.conftest import train_overrides
    from toolgrpo.cli import main

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rows = [{**rlla_row(i), "task_type": "tools"} for i in range(4)]
    data = write_jsonl(tmp_path / "remote.jsonl", rows)
    envs = f"{{tools: {{type: remote, url: 'ws://127.0.0.1:{port}/ws', connect_timeout_s: 2}}}}"
    over = train_overrides(
        tiny_model_dir, data, tmp_path / "out", 2, **{f"{KEY}enable": "true", f"{KEY}envs": envs}
    )
    with caplog.at_level(logging.WARNING, logger="toolgrpo.trainer.episodes"):
        code = main(["train", *over])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("toolgrpo")]  # one line, no trace
    assert line.startswith("toolgrpo train: error: step 1: 4 of 4 episodes failed")
    assert "environment 'remote'" in line and "cannot connect" in line
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "4 episode(s)" in warning and "ConnectionRefusedError" in warning
    assert not (tmp_path / "out" / "metrics.jsonl").exists() or not read_metrics(tmp_path / "out")


@pytest.mark.parametrize("ratio", ["-0.1", "1.5", "nan"])
def test_the_failure_ratio_is_checked_at_load(make_train_config, ratio):
    from toolgrpo.config.loader import ConfigError

    with pytest.raises(ConfigError, match="max_env_failure_ratio must be in"):
        Trainer(make_train_config(**{f"{KEY}max_env_failure_ratio": ratio}))


def test_the_router_sees_failed_episodes_at_their_group_mean():
    """The tool router needs one reward per rollout: a failure must not enter it at -1."""
    from toolgrpo.trainer.episodes import stand_in_rewards

    eps = [_episode("a"), _episode("a", True), _episode("a"), _episode("b", True)]
    eps[0].reward, eps[2].reward, eps[1].reward, eps[3].reward = 1.0, 0.0, -1.0, -1.0
    assert stand_in_rewards(eps) == [1.0, 0.5, 0.0, 0.0]


def test_async_rollouts_stop_with_the_same_one_line(
    make_train_config, tmp_path, tiny_model_dir, capsys, monkeypatch
):
    from toolgrpo import cli

    trainer = _trainer(
        make_train_config,
        tmp_path,
        tiny_model_dir,
        _tasks("bad", "bad_reset"),
        **{"async_training.enable": "true"},
    )
    monkeypatch.setattr("toolgrpo.trainer.trainer.Trainer", lambda cfg: trainer)
    assert cli.main(["train", f"trainer.output_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "toolgrpo train: error: step 1: 4 of 4 episodes" in err
